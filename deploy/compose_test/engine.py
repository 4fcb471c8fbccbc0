"""A Docker engine for the compose test: the one ``DOCKER_HOST`` (or the default socket)
names when it answers, else a private ``dockerd`` started for the run and stopped by its
PID at the end.

The private engine creates no bridge and touches no firewall (``--bridge=none
--iptables=false --ip-masq=false``): containers run on the host's network. Its images
and build cache stay in ``state/docker`` between runs; its sockets, PID file and
containerd state live under ``/run`` (a short path: socket paths are limited to 107
bytes) and go with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
START_LIMIT_S = 300.0
"""How long a private dockerd may take to answer before the run gives up on it."""
STOP_LIMIT_S = 120.0
"""How long it may take to exit after SIGTERM before it is killed."""


class EngineError(RuntimeError):
    """No engine answers and none could be started."""


@dataclass
class Engine:
    env: dict[str, str]
    """``DOCKER_HOST`` (and ``DOCKER_CONFIG``) for every docker command of the run."""
    version: str
    process: subprocess.Popen[bytes] | None = None
    """The dockerd this run started, or ``None`` for an engine that was already there."""
    log: Path | None = None
    run: Path | None = None
    """The private engine's sockets and runtime state (removed once it has stopped)."""

    def docker(
        self, *args: str, check: bool = True, capture: bool = True, extra: Mapping[str, str] = {}
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this engine; a failure names the command and its
        last lines of output."""
        result = subprocess.run(
            ["docker", *args],
            env={**os.environ, **self.env, **extra},
            check=False,
            text=True,
            capture_output=capture,
        )
        if check and result.returncode != 0:
            tail = "\n".join(f"    {line}" for line in (result.stderr or "").splitlines()[-20:])
            raise EngineError(f"docker {' '.join(args)}: exit {result.returncode}\n{tail}")
        return result

    def stop(self) -> str:
        """Stop the dockerd this run started (SIGTERM to its PID, then wait for it)."""
        if self.process is None:
            return "left running (not started by this run)"
        pid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            code = self.process.wait(STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            code = self.process.wait()
            return f"pid {pid} killed: it did not exit {STOP_LIMIT_S:.0f} s after SIGTERM"
        finally:
            self.process = None
            if self.run is not None:
                _remove_run_dir(self.run)
        return f"pid {pid} exited with {code}"


def server_version(env: Mapping[str, str]) -> str | None:
    """The engine's version when one answers at ``env``'s ``DOCKER_HOST``."""
    result = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None if result.returncode == 0 else None


def existing(config: Mapping[str, str]) -> Engine | None:
    """The engine users of this machine already have, if it answers."""
    env = {"DOCKER_HOST": os.environ.get("DOCKER_HOST", DEFAULT_SOCKET), **config}
    version = server_version(env)
    return Engine(env=env, version=version) if version else None


def run_dir(state: Path) -> Path:
    """``/run/hotseat-engine-<hash of the state dir>``: one per checkout."""
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:10]
    return Path("/run") / f"hotseat-engine-{digest}"


def dockerd_argv(state: Path, run: Path) -> list[str]:
    config = state / "daemon.json"
    config.write_text(json.dumps({}) + "\n", encoding="utf-8")  # nothing from /etc/docker
    return [
        "dockerd",
        f"--config-file={config}",
        f"--data-root={state / 'docker'}",
        f"--exec-root={run / 'exec'}",
        f"--pidfile={run / 'dockerd.pid'}",
        f"--host=unix://{run / 'docker.sock'}",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
    ]


def start_private(state: Path, config: Mapping[str, str]) -> Engine:
    """Start a dockerd of our own and wait until it answers."""
    state.mkdir(parents=True, exist_ok=True)
    run = run_dir(state)
    if (run / "dockerd.pid").exists():
        _stop_stale(run / "dockerd.pid")
    _remove_run_dir(run)
    run.mkdir(parents=True)
    log = state / "dockerd.log"
    env = {"DOCKER_HOST": f"unix://{run / 'docker.sock'}", **config}
    with log.open("ab") as out:
        process = subprocess.Popen(
            dockerd_argv(state, run), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + START_LIMIT_S
    while (version := server_version(env)) is None:
        if process.poll() is not None:
            raise EngineError(f"dockerd exited with {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            process.kill()
            raise EngineError(f"dockerd did not answer within {START_LIMIT_S:.0f} s; see {log}")
        time.sleep(0.2)
    return Engine(env=env, version=version, process=process, log=log, run=run)


def _remove_run_dir(run: Path) -> None:
    """Unmount what dockerd leaves mounted under its exec root (its ``netns/default``),
    then remove the directory."""
    mounts = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    inside = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{run}/")]
    for point in sorted(inside, reverse=True):
        subprocess.run(["umount", point], check=False, capture_output=True)
    shutil.rmtree(run, ignore_errors=True)


def _stop_stale(pidfile: Path) -> None:
    """A private dockerd left by an interrupted run of this checkout: stop it first."""
    with contextlib.suppress(ValueError, OSError):
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if cmdline[:1] == [b"dockerd"] and f"--pidfile={pidfile}".encode() in cmdline:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_LIMIT_S
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)


def engine(state: Path, config: Mapping[str, str], *, private: bool) -> Engine:
    """An answering engine: the existing one unless ``private``, else one of our own."""
    if not private and (found := existing(config)) is not None:
        return found
    if shutil.which("dockerd") is None:
        raise EngineError("no engine answers and dockerd is not installed")
    return start_private(state, config)
