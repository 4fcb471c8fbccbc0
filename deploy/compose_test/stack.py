"""compose.yaml on the host's network: the loopback override's ports and files, and the
``docker compose`` commands of the test.

deploy/compose/loopback.yaml reads a ``HOTSEAT_TEST_PORT_<SERVICE>`` variable for every
port a service listens on; :func:`choose_ports` picks a free one for each. The Hotseat
config and nginx.conf cannot read variables, so :func:`render` writes copies of
deploy/compose's own files in which each ``<service>:<port>`` becomes
``127.0.0.1:<its port>``, and fails when a file names a service it has no port for.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.compose_test.engine import Engine
from hotseat.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = ("compose.yaml", "deploy/compose/loopback.yaml")
PROJECT = "hotseat-test"
"""Not compose.yaml's ``hotseat``: the test never touches a stack a user runs as that."""
HOTSEAT_IMAGE = "hotseat:compose-test"
TESTCONTAINERS_LABEL = "org.testcontainers.lang"
"""A label on every container testcontainers (for Python) starts."""
PORTS = (
    "nats", "nats-http", "redis", "postgres", "sim-assistant", "sim-coder",
    "controller-1", "controller-2", "audit", "router-1", "router-2", "gateway",
)  # fmt: skip
"""Every port the loopback override reads: the services' own, and NATS's monitoring."""
STANDIN_VARIABLES = {
    "python": "HOTSEAT_TEST_PYTHON_IMAGE",
    "nats": "HOTSEAT_TEST_NATS_IMAGE",
    "redis": "HOTSEAT_TEST_REDIS_IMAGE",
    "postgres": "HOTSEAT_TEST_POSTGRES_IMAGE",
    "nginx": "HOTSEAT_TEST_NGINX_IMAGE",
}


def port_variable(name: str) -> str:
    return "HOTSEAT_TEST_PORT_" + name.upper().replace("-", "_")


def choose_ports() -> dict[str, int]:
    """A distinct free port on 127.0.0.1 for each name of :data:`PORTS`."""
    chosen: dict[str, int] = {}
    while len(chosen) < len(PORTS):
        port = free_port()
        if port not in chosen.values():
            chosen[PORTS[len(chosen)]] = port
    return chosen


class RenderError(ValueError):
    """A file of deploy/compose names a service the loopback override gives no port."""


SERVICE_REFERENCES = {
    "hotseat.yaml": r"address:\s*https?://(?P<service>[\w.-]+):(?P<port>\d+)",
    "nginx.conf": r"^\s*server\s+(?P<service>[\w.-]+):(?P<port>\d+)",
}
"""deploy/compose file -> where it names a service: backend addresses, nginx upstreams."""
LISTEN = re.compile(r"^(\s*)listen\s+\d+\s*;", re.MULTILINE)


def _loopback(text: str, ports: Mapping[str, int], pattern: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        service = match["service"]
        if service not in ports:
            raise RenderError(f"{where}: {match[0]!r}: no port for service {service!r}")
        return match[0].replace(f"{service}:{match['port']}", f"127.0.0.1:{ports[service]}")

    rendered, count = re.subn(pattern, replace, text, flags=re.MULTILINE)
    if count == 0:
        raise RenderError(f"{where}: names no service")
    return rendered


def render(out: Path, ports: Mapping[str, int], root: Path = ROOT) -> None:
    """Write ``out/hotseat.yaml`` and ``out/nginx.conf`` for the loopback override; nginx
    also listens on 127.0.0.1 at the gateway's port."""
    out.mkdir(parents=True, exist_ok=True)
    for name, pattern in SERVICE_REFERENCES.items():
        where = f"deploy/compose/{name}"
        text = _loopback((root / where).read_text(encoding="utf-8"), ports, pattern, where)
        if name == "nginx.conf":
            text, count = LISTEN.subn(rf"\1listen 127.0.0.1:{ports['gateway']};", text)
            if count != 1:
                raise RenderError(f"{where}: expected one `listen PORT;`, found {count}")
        (out / name).write_text(text, encoding="utf-8")


def environment(
    out: Path, ports: Mapping[str, int], images: Mapping[str, str], pip: Mapping[str, str]
) -> dict[str, str]:
    """Every variable the loopback override reads (and compose.yaml's image name)."""
    env = {"HOTSEAT_TEST_DIR": str(out), "HOTSEAT_IMAGE": HOTSEAT_IMAGE, **pip}
    env.update({port_variable(name): str(port) for name, port in ports.items()})
    env.update({STANDIN_VARIABLES[stage]: image for stage, image in images.items()})
    return env


@dataclass
class Compose:
    """``docker compose -p hotseat-test -f compose.yaml -f deploy/compose/loopback.yaml``."""

    env: dict[str, str]
    root: Path = ROOT

    def argv(self, *args: str) -> list[str]:
        files = [f"--file={self.root / name}" for name in FILES]
        return ["docker", "compose", f"--project-name={PROJECT}", *files, *args]

    def run(
        self, *args: str, capture: bool = False, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            env={**os.environ, **self.env},
            cwd=self.root,
            check=check,
            text=True,
            capture_output=capture,
        )

    def containers(self) -> list[dict[str, Any]]:
        """``docker compose ps --all`` as JSON objects, one per container."""
        out = self.run("ps", "--all", "--format=json", capture=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def leftovers(engine: Engine) -> dict[str, list[str]]:
    """Containers, networks and volumes of the test's project that the engine still has,
    and containers of the test's image that the checks started with testcontainers."""
    label = f"--filter=label=com.docker.compose.project={PROJECT}"
    return {
        "containers": engine.docker("ps", "--all", "--quiet", label).stdout.split(),
        "testcontainers": engine.docker(
            "ps",
            "--all",
            "--quiet",
            f"--filter=label={TESTCONTAINERS_LABEL}",
            f"--filter=ancestor={HOTSEAT_IMAGE}",
        ).stdout.split(),
        "networks": engine.docker("network", "ls", "--quiet", label).stdout.split(),
        "volumes": engine.docker("volume", "ls", "--quiet", label).stdout.split(),
    }
