"""Real ``llama-server`` members: the pinned binary and the generated models, made once.

When any ``realserver`` test is selected, ``scripts/llama/prepare.py`` runs before the
first test (at the end of collection, so its minutes of compiling on a fresh machine are
not charged to one test's timeout, with its progress printed to the terminal). A cached
binary makes that a check of well under a second.

If it cannot run (no compiler, no cmake, no network for the sdist), every ``realserver``
test fails with the reason under CI (``CI=true``) and is skipped with it elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hotseat.launcher import Managed
from hotseat_pool_controller.drivers.processgroup import read_pid_file
from tests.support.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
PREPARE = ROOT / "scripts" / "llama" / "prepare.py"
PREPARE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Llama:
    """Where the prepared binary and models are."""

    server: str
    models: dict[str, str]
    version: str
    build_seconds: float | None


_prepared: Llama | str | None = None
"""The result of the preparation: paths, or why it failed; None when not run."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _prepare(config: pytest.Config) -> Llama | str:
    capture = config.pluginmanager.getplugin("capturemanager")
    began = time.monotonic()
    try:
        # Build progress goes straight to the terminal (or the CI log).
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n[realserver] preparing llama-server and models: {PREPARE}", flush=True)
            done = subprocess.run(
                [sys.executable, str(PREPARE), "--json"],
                stdout=subprocess.PIPE,
                text=True,
                timeout=PREPARE_TIMEOUT_S,
                check=False,
            )
            outcome = "ready" if done.returncode == 0 else "FAILED"
            print(f"[realserver] {outcome} after {time.monotonic() - began:.1f}s", flush=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{PREPARE} did not run: {exc}"
    if done.returncode != 0:
        return f"{PREPARE} failed with exit code {done.returncode} (its output is above)"
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return Llama(
        server=found["server"],
        models=found["models"],
        version=found["version"],
        build_seconds=found.get("build_seconds"),
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Prepare once, before any test, when a realserver test is selected."""
    global _prepared  # noqa: PLW0603 - one preparation per session, read by the fixture
    if session.config.option.collectonly:
        return
    if _prepared is None and any(i.get_closest_marker("realserver") for i in session.items):
        _prepared = _prepare(session.config)


@pytest.fixture(scope="session")
def llama() -> Llama:
    if isinstance(_prepared, Llama):
        return _prepared
    reason = _prepared or "the llama-server preparation did not run"
    if _in_ci():
        pytest.fail(f"realserver tests need llama-server: {reason}", pytrace=False)
    pytest.skip(f"no llama-server: {reason}")


@pytest.fixture
def member_pids(tmp_path: Path) -> Iterator[None]:
    """Kill any member process a test leaves behind (a controller that was SIGKILLed)."""
    yield
    for pid_file in tmp_path.glob("members/*/*.pid"):
        record = read_pid_file(pid_file)
        if record is None:
            continue
        try:
            os.killpg(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.fixture
def make_stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed, member_pids: None
) -> Iterator[Callable[[dict[str, Any]], Stack]]:
    stacks: list[Stack] = []

    def make(config: dict[str, Any]) -> Stack:
        stack = Stack(tmp_path, prefix, nats_server.url, redis_server.url, config)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.stop()
