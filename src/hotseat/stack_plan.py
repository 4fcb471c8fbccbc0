"""What ``hotseat up`` will start for a config, decided without starting anything.

Pure functions of the config (plus "is this installed" and "is this port free"), so the
choices are easy to read and to test: which backends get a sim, which services run on
which ports with which extra flags, which pool members to warm when no controller runs,
and the ready-to-paste examples.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hotseat.launcher import free_port
from hotseat_common.config import HotseatConfig
from hotseat_common.config.model import SimMember

LOCAL_HOST = "127.0.0.1"
SIMULATED_DRIVERS = frozenset({"sim", "http"})
"""Pool drivers whose members a sim can stand in for (process/kubernetes start their own)."""
API_KEY_VARIABLE = "HOTSEAT_API_KEY"


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_in_use(port: int, host: str = LOCAL_HOST) -> bool:
    """True when nothing could listen on ``host:port`` now (as uvicorn binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True, slots=True)
class SimPlan:
    backend: str
    host: str
    port: int
    loaded: bool
    """Unpooled backends start loaded; pool members wait for the controller."""

    @property
    def name(self) -> str:
        return f"sim-{self.backend}"

    @property
    def url(self) -> str:
        return _url(self.host, self.port)


def plan_sims(config: HotseatConfig) -> tuple[list[SimPlan], list[str]]:
    """A sim for every backend whose address is on this machine, and notes on the others."""
    sims: list[SimPlan] = []
    notes: list[str] = []
    for backend in config.backends:
        parts = urlsplit(backend.address)
        host = parts.hostname or ""
        if not is_loopback(host):
            continue  # a remote or cloud backend: it is real, not ours to start
        if parts.scheme != "http":
            notes.append(f"backend {backend.name}: {backend.address} is not plain http; no sim")
            continue
        if backend.pool is not None:
            pool = config.pool(backend.pool.name)
            if pool is not None and pool.driver.kind not in SIMULATED_DRIVERS:
                notes.append(
                    f"backend {backend.name}: pool {pool.name} uses the {pool.driver.kind} "
                    "driver, which starts its own server; no sim"
                )
                continue
        port = parts.port or 80
        sims.append(SimPlan(backend.name, host, port, loaded=backend.pool is None))
    return sims, notes


@dataclass(frozen=True, slots=True)
class ServicePlan:
    name: str
    entry_point: str
    port: int
    extra_args: tuple[str, ...] = ()
    uses_redis: bool = False
    """Gets ``--redis-url`` once Redis is found or launched."""
    host: str = LOCAL_HOST

    @property
    def url(self) -> str:
        return _url(self.host, self.port)


SERVICES = (
    ("audit", "hotseat-audit", "hotseat_audit.main"),
    ("controller", "hotseat-controller", "hotseat_pool_controller.main"),
    ("router", "hotseat-router", "hotseat_router.main"),
)
ROUTER_PORT = 8080
CONTROLLER_PORT = 8090
AUDIT_PORT = 8082
DEFAULT_PORTS = {"router": ROUTER_PORT, "controller": CONTROLLER_PORT, "audit": AUDIT_PORT}
"""Where ``hotseat up`` runs each service unless told otherwise: the ports ``hotseat
status`` and ``hotseat audit`` (and a client's base URL) default to."""
PORT_FLAGS = {"router": "--port", "controller": "--controller-port", "audit": "--audit-port"}
"""The ``hotseat up`` flag that moves each service (0: any free port)."""


def plan_services(
    ports: Mapping[str, int],
    workdir: Path,
    *,
    available: Callable[[str], bool],
    binary: Callable[[str], bool],
) -> tuple[list[ServicePlan], list[str]]:
    """The services to start (installed ones only), each on its port in ``ports`` (a
    missing one: :data:`DEFAULT_PORTS`; 0: a free port), and a note per service left out."""
    plans: list[ServicePlan] = []
    notes: list[str] = []
    for name, entry_point, module in SERVICES:
        if not available(module):
            notes.append(f"skipping {name}: {module} is not installed yet")
            continue
        if not binary(entry_point):
            notes.append(f"skipping {name}: the {entry_point} command is not installed")
            continue
        port = ports.get(name, DEFAULT_PORTS[name]) or free_port()
        extra: tuple[str, ...] = ()
        if name == "audit":
            extra = ("--dsn", f"sqlite:///{(workdir / 'audit.db').resolve()}")
        audit = next((p for p in plans if p.name == "audit"), None)
        if name == "controller" and audit is not None:
            extra = ("--audit-url", audit.url)  # the web console's timeline reads it
        plans.append(ServicePlan(name, entry_point, port, extra, uses_redis=name == "controller"))
    return plans, notes


def warm_members(config: HotseatConfig) -> list[tuple[str, str, str, float]]:
    """``(pool, member, backend, loadSeconds)`` to load when no controller will: each sim
    pool's default member, else its first."""
    out: list[tuple[str, str, str, float]] = []
    for pool in config.pools:
        if pool.driver.kind != "sim":
            continue
        name = pool.default or pool.members[0].name
        member = pool.member(name)
        backend = config.member_backend(pool.name, name)
        if member is None or backend is None:
            continue
        sim = member.sim or SimMember()
        out.append((pool.name, name, backend.name, sim.load_seconds))
    return out


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """A pool whose members the controller loads at start, before any request."""

    pool: str
    members: tuple[str, ...]
    """Its ``default`` member, and its ``pinned`` ones."""
    expected_s: float | None
    """How long loading them should take (a sim pool's ``loadSeconds``; else unknown)."""
    timeout_s: float
    """How long to wait for them at most: the expected time, else ``swapTimeout`` per
    member (past which the controller gives the load up)."""


def warm_targets(config: HotseatConfig, *, margin_s: float) -> list[WarmTarget]:
    """The members a controller warms at start, pool by pool: ``hotseat up`` says "ready"
    once every one of them is resident. A pool with no default and nothing pinned is left
    cold until its first request."""
    out: list[WarmTarget] = []
    for pool in config.pools:
        names = [m.name for m in pool.members if m.name == pool.default or m.pinned]
        if not names:
            continue
        expected: float | None = None
        if pool.driver.kind == "sim":
            members = [pool.member(n) for n in names]
            expected = sum((m.sim or SimMember()).load_seconds for m in members if m is not None)
        timeout = (expected if expected is not None else pool.swap_timeout * len(names)) + margin_s
        out.append(WarmTarget(pool.name, tuple(names), expected, timeout))
    return out


def example_model(config: HotseatConfig) -> str:
    """A model name that a rule routes: a literal one of a rule, else the default route's."""
    for rule in config.rules:
        for model in rule.match.models:
            if not any(ch in model for ch in "*?["):
                return model
    backend = config.backend(config.default_route) if config.default_route else None
    if backend is None and config.backends:
        backend = config.backends[0]
    return backend.name if backend is not None else "default"


def _needs_key(config: HotseatConfig) -> bool:
    return config.router.api_keys is not None or bool(
        os.environ.get("HOTSEAT_API_KEYS") or os.environ.get("HOTSEAT_API_KEYS_FILE")
    )


def _sim_target(config: HotseatConfig, sims: list[SimPlan]) -> SimPlan | None:
    warm = {backend for _, _, backend, _ in warm_members(config)}
    ranked = sorted(sims, key=lambda s: (not s.loaded, s.backend not in warm))
    return ranked[0] if ranked else None


def examples(
    config: HotseatConfig, sims: list[SimPlan], router_url: str | None, *, python: str
) -> tuple[str, str | None]:
    """The ready-to-paste curl and OpenAI SDK example, and a note on where they go."""
    note: str | None = None
    key = False
    if router_url is not None:
        base, model, key = router_url, example_model(config), _needs_key(config)
    else:
        sim = _sim_target(config, sims)
        if sim is None:
            return "hotseat up: no router and no local backend to send requests to", None
        backend = config.backend(sim.backend)
        base = sim.url
        model = (backend.model if backend is not None else None) or sim.backend
        note = f"hotseat up: the router is not installed yet; these go to {sim.name} directly"
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}
    )
    auth = f' -H "Authorization: Bearer ${API_KEY_VARIABLE}"' if key else ""
    curl = (
        f"curl -s {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"-d {shlex.quote(body)}"
    )
    # JSON strings are Python string literals too, and keep the program free of single
    # quotes so that the shell-quoted form reads cleanly.
    api_key = f"os.environ[{json.dumps(API_KEY_VARIABLE)}]" if key else '"none"'
    program = (
        "import os; from openai import OpenAI; "
        f"client = OpenAI(base_url={json.dumps(base + '/v1')}, api_key={api_key}); "
        f"reply = client.chat.completions.create(model={json.dumps(model)}, "
        'messages=[{"role": "user", "content": "Hello!"}]); '
        "print(reply.choices[0].message.content)"
    )
    sdk = f"{shlex.quote(python)} -c {shlex.quote(program)}"
    if key:
        extra = f"set {API_KEY_VARIABLE} to one of the router's API keys first"
        note = f"{note}\n{extra}" if note else f"hotseat up: {extra}"
    return f"Try it:\n  {curl}\n  {sdk}", note
