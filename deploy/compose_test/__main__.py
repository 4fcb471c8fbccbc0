"""``make compose-test``: run ``python -m deploy.compose_test --help`` for the options.

Phases, each timed and printed as it ends:

1. tools: ``dockerd`` (Debian's docker.io) and ``debootstrap`` installed with apt-get when
   missing; the Compose v2 plugin (:func:`deploy.compose_test.images.compose_plugin`).
2. engine: the one that answers, or a private dockerd (no bridge, no iptables).
3. base: a Debian bookworm image from debootstrap (skipped when the engine has it).
4. stand-ins: deploy/standins/Dockerfile, for the public images compose.yaml names.
5. build: ``docker compose build``, the Hotseat image from the real Dockerfile.
6. start: ``docker compose up --detach --wait``, until every service is healthy.
7. checks: ``pytest tests/deploy/compose`` against the running stack.
8. down: ``docker compose down --volumes``; no container, network or volume may remain.
9. engine: the private dockerd stopped by its PID.

Exit status 0 only when every phase passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from deploy.compose_test import images, stack
from deploy.compose_test.engine import Engine, EngineError, engine, run_dir
from deploy.compose_test.host import install_missing, package_sources

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".hotseat/compose-test"
TOOLS = {"dockerd": "docker.io", "docker": "docker.io", "debootstrap": "debootstrap"}
T = TypeVar("T")


def say(text: str) -> None:
    sys.stdout.write(f"compose-test: {text}\n")
    sys.stdout.flush()


@dataclass
class Phases:
    """How long each phase took, in the order they ran."""

    seconds: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = time.monotonic() - start

    def timed(self, name: str, action: Callable[[], T], detail: Callable[[T], str]) -> T:
        with self.phase(name):
            result = action()
        say(f"{name:<10} {self.seconds[name]:6.1f} s  {detail(result)}")
        return result

    def summary(self) -> str:
        parts = ", ".join(f"{name} {s:.0f} s" for name, s in self.seconds.items())
        return f"total {time.monotonic() - self.started:.0f} s ({parts})"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.compose_test",
        description="Build the Hotseat image and run compose.yaml under a real Docker engine.",
    )
    parser.add_argument(
        "--private-engine", action="store_true",
        help="start a dockerd of our own even when one answers already",
    )  # fmt: skip
    parser.add_argument(
        "--fresh", action="store_true",
        help=f"empty the private engine's images and build cache first ({STATE})",
    )  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true",
        help="leave the stack and the engine running after the checks (the next run, or "
        f"`docker compose -p {stack.PROJECT} down -v`, takes it down)",
    )  # fmt: skip
    parser.add_argument("pytest_args", nargs="*", help="more arguments for the checks' pytest")
    return parser.parse_args()


def prepare(phases: Phases, fresh: bool) -> list[str]:
    STATE.mkdir(parents=True, exist_ok=True)
    if fresh:
        shutil.rmtree(STATE / "docker", ignore_errors=True)
    return phases.timed(
        "tools",
        lambda: install_missing(TOOLS),
        lambda installed: f"apt-get installed {', '.join(installed)}" if installed else "present",
    )


def checks(compose_env: dict[str, str], ports: dict[str, int], pytest_args: list[str]) -> int:
    url = "http://127.0.0.1:{}".format
    description = {
        "project": stack.PROJECT,
        "image": stack.HOTSEAT_IMAGE,
        "compose": stack.Compose(compose_env).argv(),
        "gateway": url(ports["gateway"]),
        "routers": {n: url(ports[n]) for n in ("router-1", "router-2")},
        "controllers": {n: url(ports[n]) for n in ("controller-1", "controller-2")},
        "audit": url(ports["audit"]),
        "postgres": f"postgresql://hotseat:hotseat@127.0.0.1:{ports['postgres']}/hotseat",
        "nats": f"nats://127.0.0.1:{ports['nats']}",
        "redis": f"redis://127.0.0.1:{ports['redis']}/0",
        "config_dir": str(STATE / "loopback"),
    }
    path = STATE / "stack.json"
    path.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    env = {
        **os.environ,
        **compose_env,
        "HOTSEAT_COMPOSE_TEST_STACK": str(path),
        "TESTCONTAINERS_RYUK_DISABLED": "true",  # its reaper image is in no registry here
    }
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "tests/deploy/compose"]
    return subprocess.run([*argv, *pytest_args], env=env, cwd=ROOT, check=False).returncode


def run(args: argparse.Namespace) -> int:
    phases = Phases()
    prepare(phases, args.fresh)
    docker = phases.timed(
        "engine",
        lambda: engine(STATE, {}, private=args.private_engine),
        lambda e: (
            f"dockerd {e.version}, "
            + (
                f"started (pid {e.process.pid}, {run_dir(STATE)})"
                if e.process
                else "already running"
            )
        ),
    )
    compose: stack.Compose | None = None
    failed = True
    try:
        phases.timed(
            "compose", lambda: images.compose_plugin(docker, STATE), lambda v: f"docker compose {v}"
        )
        if any((left := stack.leftovers(docker)).values()):  # an earlier run's, kept or cut
            say("removing what an earlier run left: docker compose down --volumes")
            docker.docker("compose", f"--project-name={stack.PROJECT}", "down", "--volumes")
            if left["testcontainers"]:
                docker.docker("rm", "--force", "--volumes", *left["testcontainers"])
        sources = package_sources()
        phases.timed("base", lambda: images.base_image(docker, sources, STATE), lambda how: how)
        built = phases.timed(
            "stand-ins",
            lambda: images.standins(docker, sources.pip),
            lambda found: ", ".join(found.values()),
        )
        ports = stack.choose_ports()
        stack.render(STATE / "loopback", ports)
        compose = stack.Compose(
            {**docker.env, **stack.environment(STATE / "loopback", ports, built, sources.pip)}
        )
        ready = compose  # what the lambdas below close over, known not to be None
        phases.timed(
            "build",
            lambda: ready.run("build", "--progress=plain", capture=True),
            lambda _: _sizes(docker, stack.HOTSEAT_IMAGE, built["python"]),
        )
        phases.timed(
            "start",
            lambda: ready.run("up", "--detach", "--wait", capture=True),
            lambda _: f"{len(ready.containers())} containers healthy",
        )
        code = phases.timed(
            "checks",
            lambda: checks(ready.env, ports, args.pytest_args),
            lambda c: "pytest passed" if c == 0 else f"pytest failed (exit {c})",
        )
        failed = code != 0
    except (EngineError, stack.RenderError, subprocess.CalledProcessError) as exc:
        say(f"FAILED: {exc}")
        if isinstance(exc, subprocess.CalledProcessError) and exc.stderr:
            sys.stdout.write(exc.stderr[-4000:])
        if compose is not None:
            compose.run("ps", "--all", check=False)
            compose.run("logs", "--tail=30", check=False)
    finally:
        if args.keep:
            say("--keep: the stack and the engine are left running; env for docker commands:")
            for key, value in (compose.env if compose else docker.env).items():
                sys.stdout.write(f"  export {key}={value}\n")
        else:
            try:
                failed = _down(phases, docker, compose) or failed
            finally:
                phases.timed("stop", docker.stop, lambda how: f"engine {how}")
    say(("FAILED, " if failed else "passed, ") + phases.summary())
    return 1 if failed else 0


def _sizes(docker: Engine, image: str, base: str) -> str:
    return (
        f"{image} {images.size_mb(docker, image):.0f} MB "
        f"(its base {base} {images.size_mb(docker, base):.0f} MB)"
    )


def _down(phases: Phases, docker: Engine, compose: stack.Compose | None) -> bool:
    """Take the stack down; true when anything of it is left behind."""
    if compose is not None:
        phases.timed(
            "down", lambda: compose.run("down", "--volumes", "--remove-orphans", capture=True),
            lambda _: "docker compose down --volumes",
        )  # fmt: skip
    left = stack.leftovers(docker)
    if any(left.values()):
        say(f"FAILED: left behind: {left}")
        return True
    say("nothing left behind: no container, network or volume of the project")
    return False


def main() -> int:
    return run(parse_args())


if __name__ == "__main__":
    sys.exit(main())
