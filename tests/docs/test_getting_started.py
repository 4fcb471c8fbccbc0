"""docs/getting-started.md followed as a new user would: every command in an ``sh`` block
runs as written, in order, against the stack its own ``make run`` starts.

Conventions of the page, which this test enforces:

- ``sh`` blocks hold commands that need no Docker and no cluster; ``bash`` blocks hold the
  ones that do (``docker``, ``kubectl``), and those never appear in an ``sh`` block.
- ``make run`` starts the stack in the foreground: here it runs in the background until it
  prints that it is ready, and the page's "Ctrl-C" is a SIGINT to it at the end.
- ``make test`` is the suite this test belongs to (CI has just run it): it is checked to be
  on the page, not run again.
- ``<controller>`` and ``<audit>`` stand for the URLs ``make run`` printed for those parts,
  as the page tells the reader.

The stack uses the ports the page shows (router 8080, controller 8090, audit 8082, sims
9101 and 9102) and the private
NATS and Redis ``make run`` starts; its subject, key and stream names get a unique prefix
through the environment so that it cannot meet another stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hotseat.stack_plan import port_in_use
from hotseat.up import STOP_BUDGET_S
from tests.support.infra import unique_prefix
from tests.up.harness import Up, descendants, gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PLACEHOLDER = re.compile(r"<(controller|audit|router|nats|redis)>")
NEEDS_DOCKER = re.compile(r"^(docker|kubectl|helm)\b")
PAGE_PORTS = (8080, 8090, 8082, 9101, 9102)


@dataclass(frozen=True)
class Command:
    line: str
    block: int


def commands(text: str, language: str = "sh") -> list[Command]:
    """Each command line of the page's ``language`` blocks, continuation lines joined."""
    found: list[Command] = []
    for index, match in enumerate(FENCE.finditer(text)):
        if match[1] != language:
            continue
        pending = ""
        for raw in match[2].splitlines():
            line = raw.rstrip()
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            line = (pending + line).strip()
            pending = ""
            if line and not line.startswith("#"):
                found.append(Command(line, index))
    return found


def test_page_marks_every_docker_and_cluster_command_as_bash():
    """sh blocks run here, so no docker or kubectl command may hide in one; and the page
    does show the Docker and Kubernetes commands (in bash blocks)."""
    text = PAGE.read_text(encoding="utf-8")
    runnable = commands(text)
    assert [c.line for c in runnable if NEEDS_DOCKER.match(c.line)] == []
    assert [c.line.split()[:2] for c in runnable[:2]] == [["make", "run"], ["make", "test"]]
    docker = [c.line for c in commands(text, "bash")]
    assert any(line.startswith("docker compose up") for line in docker)
    assert any(
        line.startswith("kubectl apply -k deploy/kubernetes/overlays/example") for line in docker
    )


def test_page_shows_the_readme_commands():
    """The page starts from the README's two commands, exactly as the README writes them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = [c.line for c in commands(PAGE.read_text(encoding="utf-8"))]
    for line in page[:2]:
        assert line in readme


class Stack:
    """``make run`` as the page starts it: its own session, so SIGINT reaches the whole
    foreground group the way Ctrl-C does."""

    def __init__(self, line: str, env: dict[str, str]) -> None:
        popen = subprocess.Popen(
            ["bash", "-c", line],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.up = Up(popen)
        threading.Thread(target=self.up._read, daemon=True).start()
        self.seen: set[int] = set()

    def ctrl_c(self) -> tuple[int, float]:
        """SIGINT to the group; the exit status and how long the stop took."""
        started = time.monotonic()
        os.killpg(self.up.popen.pid, signal.SIGINT)
        code = self.up.popen.wait(4 * STOP_BUDGET_S)  # only a bound on a hung test
        elapsed = time.monotonic() - started
        while (line := self.up._queue.get(timeout=5)) is not None:
            self.up.lines.append(line)
        return code, elapsed

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.up.popen.pid, signal.SIGKILL)
        self.up.kill_tree(self.seen)


def run(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def check_output(line: str, done: subprocess.CompletedProcess[str]) -> None:
    """What each kind of command must have printed for the step to count as working."""
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    if line.startswith("curl"):
        reply = json.loads(done.stdout)
        assert reply["choices"][0]["message"]["content"], done.stdout
    elif "check-config" in line:
        assert ": valid" in done.stdout
    elif "hotseat status" in line:
        assert "gpu0" in done.stdout
    elif line.startswith(".venv/bin/python -c"):
        assert done.stdout.strip()
    elif line.startswith("make deploy-check"):
        assert "0 problem(s)" in done.stdout


def test_getting_started_commands_work_as_written(tmp_path: Path):
    """Every sh command of the page, in order: make run comes up on the page's ports, the
    curls and the SDK call are answered (the coder call through a real swap), status and
    the audit log show the swap, the config checks and make deploy-check pass, and Ctrl-C
    stops everything within up's stop budget."""
    busy = [port for port in PAGE_PORTS if port_in_use(port)]
    if busy:
        pytest.skip(f"ports {busy} are taken on this machine; the page's stack needs them")
    prefix = unique_prefix()
    env = {
        **os.environ,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_KEY_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"AUDIT_{prefix}",
        "TMPDIR": str(tmp_path),
        "HOTSEAT_STATE_DIR": str(tmp_path / "state"),
    }
    for name in ("HOTSEAT_CONTROLLER_URL", "HOTSEAT_AUDIT_URL"):
        env.pop(name, None)
    steps = commands(PAGE.read_text(encoding="utf-8"))
    stack: Stack | None = None
    ran: list[str] = []
    try:
        for step in steps:
            line = step.line
            if line.startswith("make test"):
                continue
            if line.startswith("make run"):
                stack = Stack(line, env)
                parts = stack.up.wait_ready(timeout=240)
                assert parts["router"] == "http://127.0.0.1:8080", stack.up.output
                assert parts["controller"] == "http://127.0.0.1:8090", stack.up.output
                assert parts["audit"] == "http://127.0.0.1:8082", stack.up.output
                stack.seen = descendants(stack.up.popen.pid)
                continue
            assert stack is not None, "a command before make run"
            line = PLACEHOLDER.sub(lambda m, parts=parts: parts[m[1]], line)
            done = run(line, env)
            if "audit query" in line:
                done = _until_swap_is_audited(line, env, done)
            check_output(line, done)
            ran.append(line)
        assert stack is not None
        opened = _open_the_pages_it_links(PAGE.read_text(encoding="utf-8"))
        code, _seconds = stack.ctrl_c()
        # make passes an interrupt on by dying of SIGINT itself, as it does at a terminal
        assert code in {0, -signal.SIGINT}, stack.up.output
        assert "hotseat up: stopped in" in stack.up.output
        # Every part stopped on its SIGTERM: up kills what is left at its stop budget, and
        # says so (an event, where the elapsed time would measure the machine's load).
        assert "did not stop on SIGTERM" not in stack.up.output, stack.up.output
        assert all(gone(pid) for pid in stack.seen), stack.seen
    finally:
        if stack is not None:
            stack.kill()
    assert len(ran) >= 8, ran
    assert any(url.endswith("/ui") for url in opened), opened


LOCAL_LINK = re.compile(r"<(http://127\.0\.0\.1:\d+/[^>\s]*)>")
ASSET = re.compile(r'(?:href|src)="(/[^"]+)"')


def _open_the_pages_it_links(page: str) -> list[str]:
    """Every page of the running stack the text links to (the web console) answers as a
    browser would find it: the HTML and every stylesheet and script it loads."""
    opened = []
    for url in LOCAL_LINK.findall(page):
        answer = httpx.get(url, timeout=30, follow_redirects=True)
        assert answer.status_code == 200, url
        for asset in ASSET.findall(answer.text):
            loaded = httpx.get(answer.url.join(asset), timeout=30)
            assert loaded.status_code == 200, asset
            assert loaded.content, asset
        opened.append(url)
    return opened


def _until_swap_is_audited(
    line: str, env: dict[str, str], done: subprocess.CompletedProcess[str]
) -> subprocess.CompletedProcess[str]:
    """The audit service stores events a moment after they happen: ask again briefly."""
    deadline = time.monotonic() + 30
    while "swap_completed" not in done.stdout and time.monotonic() < deadline:
        time.sleep(0.5)  # the CLI offers no wait: ask the audit service again
        done = run(line, env)
    assert "swap_completed" in done.stdout, done.stdout + done.stderr
    return done
