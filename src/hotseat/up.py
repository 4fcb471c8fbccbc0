"""``hotseat up``: run a whole local stack in the foreground.

Algorithm:

1. Load and validate the config (exit 1 with every error).
2. NATS and Redis: reuse the servers named by ``--nats-url`` / ``--redis-url`` (or
   ``HOTSEAT_NATS_URL`` / ``HOTSEAT_REDIS_URL``) when set and answering, else launch
   private ones on free ports with their data in a temp dir (never whatever listens on
   the default ports).
3. One ``hotseat-sim`` per loopback backend (:mod:`hotseat.stack_plan` decides which):
   pooled members start unloaded, unpooled backends start loaded.
4. The services that are installed, each on its fixed port (the one the other commands
   default to, :data:`~hotseat.stack_plan.DEFAULT_PORTS`; moved by ``--port``,
   ``--controller-port``, ``--audit-port``, 0 for any free one): ``hotseat-audit``
   (SQLite in the temp dir) and ``hotseat-controller``, then ``hotseat-router``. A port
   in use stops ``hotseat up`` before it starts anything, naming the flag. One not
   installed yet is skipped with a note. Everyone gets the same NATS, Redis, subject and
   key prefixes. Without a controller, each pool's default member is loaded directly so
   that the printed examples answer.
5. Wait until every part is ready and the members the controller warms at start (each
   pool's ``default`` and ``pinned`` ones) are resident, with a progress line per pool
   while they load; print ``<name> <url>`` per part and a curl and an OpenAI SDK
   example, record the URLs for the other commands (:mod:`hotseat.up_state`), then stay
   in the foreground.
6. On SIGINT or SIGTERM (or when a part dies) stop everything that was started, newest
   first, within :data:`STOP_BUDGET_S`, and exit.

Each child's output goes to a log file in the temp dir, which is kept for reading.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

import httpx

from hotseat.launcher import (
    LaunchError,
    Managed,
    find_binary,
    nats_reachable,
    redis_reachable,
    spawn,
    start_nats,
    start_redis,
)
from hotseat.stack_plan import (
    PORT_FLAGS,
    ServicePlan,
    SimPlan,
    WarmTarget,
    examples,
    plan_services,
    plan_sims,
    port_in_use,
    warm_members,
    warm_targets,
)
from hotseat.up_state import remove_state, write_state
from hotseat_common.config import ConfigError, HotseatConfig, load_config
from hotseat_common.keys import DEFAULT_KEY_PREFIX
from hotseat_common.subjects import DEFAULT_AUDIT_STREAM, DEFAULT_PREFIX

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

SIM_READY_TIMEOUT_S = 60.0
SERVICE_READY_TIMEOUT_S = 90.0
WARM_MARGIN_S = 30.0
PROGRESS_EVERY_S = 2.0
"""While members load, a progress line at least this often (and at every change)."""
STOP_BUDGET_S = 25.0
"""Everything is stopped within this, leaving margin under the promised 30 s."""
SERVICE_SHUTDOWN_GRACE_S = 5
SIM_SHUTDOWN_GRACE_S = 2
PROBE = httpx.Timeout(2.0)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while the stack was starting."""


@dataclass
class Tier:
    """Processes started together and stopped together."""

    name: str
    procs: list[Managed] = field(default_factory=list)
    stop_cap_s: float = 8.0


@dataclass
class Stack:
    """What ``hotseat up`` started, in start order, and how to stop it."""

    out: TextIO
    stop_requested: threading.Event = field(default_factory=threading.Event)
    tiers: list[Tier] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def part(self, name: str, url: str) -> None:
        self.lines.append((name, url))

    def check_stop(self) -> None:
        if self.stop_requested.is_set():
            raise Interrupted

    def add(self, tier: Tier) -> Tier:
        self.tiers.append(tier)
        return tier

    def procs(self) -> Iterator[Managed]:
        for tier in self.tiers:
            yield from tier.procs

    def wait_ready(self, tier: Tier, urls: Sequence[str], timeout: float) -> None:
        """Wait until every process of ``tier`` answers 200 at its URL."""
        pending = dict(zip(urls, tier.procs, strict=True))
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0) as client:
            while pending:
                self.check_stop()
                for url, proc in list(pending.items()):
                    if not proc.alive():
                        raise LaunchError(
                            f"{proc.name} exited during start-up (log: {proc.log_path}):\n"
                            f"{proc.log_text()[-2000:]}"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(url).status_code == 200:
                            del pending[url]
                if pending and time.monotonic() > deadline:
                    names = ", ".join(p.name for p in pending.values())
                    raise LaunchError(f"not ready after {timeout:.0f}s: {names}")
                if pending:
                    time.sleep(0.05)

    def stop(self) -> None:
        """Stop every tier, newest first, within :data:`STOP_BUDGET_S` in total."""
        deadline = time.monotonic() + STOP_BUDGET_S
        tiers = [t for t in reversed(self.tiers) if t.procs]
        for index, tier in enumerate(tiers):
            later = len(tiers) - index - 1
            budget = min(tier.stop_cap_s, deadline - time.monotonic() - later)
            for name in _stop_tier(tier.procs, max(0.5, budget)):
                self.say(f"hotseat up: {name} did not stop on SIGTERM in time: killed")
        self.tiers.clear()


def _stop_tier(procs: Sequence[Managed], timeout: float) -> list[str]:
    """SIGTERM all at once, wait until ``timeout``, SIGKILL what is left, sweep groups;
    the names of those that had to be killed."""
    running = [proc for proc in procs if proc.alive()]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed = [
        proc.name
        for proc in procs
        if proc.stop(timeout=max(0.1, deadline - time.monotonic())) == -signal.SIGKILL
        and proc in running
    ]
    for proc in procs:
        # Each child leads its own process group: take any grandchild with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return killed


@contextlib.contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` instead of raising, for as long as the stack runs."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _start_infra(
    stack: Stack, workdir: Path, nats_url: str | None, redis_url: str | None
) -> tuple[str, str]:
    """NATS and Redis: the ones named (``--nats-url`` / ``--redis-url``, else
    ``HOTSEAT_NATS_URL`` / ``HOTSEAT_REDIS_URL``) when they answer, else private ones.
    Servers that merely listen on the default ports are never used unasked: their state
    would mix with this stack's."""
    if nats_url and nats_reachable(nats_url):
        stack.say(f"hotseat up: reusing NATS at {nats_url}")
    else:
        if nats_url:
            stack.say(f"hotseat up: NATS at {nats_url} does not answer; launching one")
        nats = start_nats(workdir / "nats")
        stack.add(Tier("nats", [nats], stop_cap_s=3))
        nats_url = nats.url
    stack.part("nats", nats_url)
    stack.check_stop()
    if redis_url and redis_reachable(redis_url):
        stack.say(f"hotseat up: reusing Redis at {redis_url}")
    else:
        if redis_url:
            stack.say(f"hotseat up: Redis at {redis_url} does not answer; launching one")
        redis = start_redis(workdir / "redis")
        stack.add(Tier("redis", [redis], stop_cap_s=3))
        redis_url = redis.url
    stack.part("redis", redis_url)
    stack.check_stop()
    return nats_url, redis_url


@dataclass(frozen=True)
class Shared:
    """What every child is given."""

    config_path: Path
    nats_url: str
    redis_url: str
    logs: Path
    env: dict[str, str]


def _shared_env() -> dict[str, str]:
    return {
        "HOTSEAT_SUBJECT_PREFIX": os.environ.get("HOTSEAT_SUBJECT_PREFIX") or DEFAULT_PREFIX,
        "HOTSEAT_KEY_PREFIX": os.environ.get("HOTSEAT_KEY_PREFIX") or DEFAULT_KEY_PREFIX,
        "HOTSEAT_AUDIT_STREAM": os.environ.get("HOTSEAT_AUDIT_STREAM") or DEFAULT_AUDIT_STREAM,
    }


def _start_sims(stack: Stack, sims: Sequence[SimPlan], shared: Shared) -> None:
    if not sims:
        return
    tier = stack.add(Tier("sims", stop_cap_s=4))
    binary = find_binary("hotseat-sim")
    for sim in sims:
        argv = [
            binary, "--config", str(shared.config_path), "--backend", sim.backend,
            "--host", sim.host, "--port", str(sim.port), "--redis-url", shared.redis_url,
            "--loaded", "true" if sim.loaded else "false",
            "--shutdown-grace", str(SIM_SHUTDOWN_GRACE_S),
        ]  # fmt: skip
        tier.procs.append(
            spawn(
                sim.name,
                argv,
                url=sim.url,
                log_path=shared.logs / f"{sim.name}.log",
                env=shared.env,
            )
        )
    stack.wait_ready(tier, [f"{s.url}/readyz" for s in sims], SIM_READY_TIMEOUT_S)
    for sim in sims:
        stack.part(sim.name, sim.url)


def _start_services(stack: Stack, plans: Sequence[ServicePlan], shared: Shared) -> None:
    """Start ``plans`` at once and wait until all are ready."""
    _ready(stack, _spawn_services(stack, plans, shared), plans)


def _ready(stack: Stack, tier: Tier | None, plans: Sequence[ServicePlan]) -> None:
    """Wait until the services ``plans`` of ``tier`` are ready; record their URLs."""
    if tier is None:
        return
    stack.wait_ready(tier, [f"{p.url}/readyz" for p in plans], SERVICE_READY_TIMEOUT_S)
    for plan in plans:
        stack.part(plan.name, plan.url)


def _spawn_services(stack: Stack, plans: Sequence[ServicePlan], shared: Shared) -> Tier | None:
    """Start ``plans`` at once (``None`` when there is none)."""
    if not plans:
        return None
    tier = stack.add(Tier("+".join(p.name for p in plans)))
    for plan in plans:
        argv = [
            find_binary(plan.entry_point),
            "--config", str(shared.config_path), "--host", plan.host, "--port", str(plan.port),
            "--nats-url", shared.nats_url, "--shutdown-grace", str(SERVICE_SHUTDOWN_GRACE_S),
            *plan.extra_args, *(("--redis-url", shared.redis_url) if plan.uses_redis else ()),
        ]  # fmt: skip
        tier.procs.append(
            spawn(
                plan.name,
                argv,
                url=plan.url,
                log_path=shared.logs / f"{plan.name}.log",
                env=shared.env,
            )
        )
    return tier


def _warm(stack: Stack, config: HotseatConfig, sims: Sequence[SimPlan]) -> None:
    """Without a controller, load each pool's default (or first) member directly."""
    by_backend = {s.backend: s for s in sims}
    with httpx.Client(timeout=PROBE) as client:
        for pool, member, backend, load_s in warm_members(config):
            sim = by_backend.get(backend)
            if sim is None:
                continue
            stack.say(f"hotseat up: no controller; loading {pool}/{member} directly")
            client.post(f"{sim.url}/control/load", json={}).raise_for_status()
            _wait_healthy(stack, client, sim.url, load_s + WARM_MARGIN_S)


def _wait_warm(stack: Stack, config: HotseatConfig, controller_url: str) -> None:
    """Until the controller has made every member it warms at start resident, so that
    the first request after "ready" is not held for a load; a line per pool as it goes."""
    with httpx.Client(timeout=PROBE) as client:
        for target in warm_targets(config, margin_s=WARM_MARGIN_S):
            _wait_pool_warm(stack, client, f"{controller_url}/v1/pools/{target.pool}", target)


def _wait_pool_warm(stack: Stack, client: httpx.Client, url: str, target: WarmTarget) -> None:
    names = ", ".join(target.members)
    started = time.monotonic()
    said, said_at = "", started
    while True:
        stack.check_stop()
        view = _pool_view(client, url)
        now = time.monotonic()
        if view is not None and set(target.members) <= _residents(view):
            stack.say(f"hotseat up: {target.pool}: {names} resident")
            return
        if now - started > target.timeout_s:
            raise LaunchError(f"{target.pool}: {names} not resident after {target.timeout_s:.0f}s")
        state = _progress(view, names)
        if state != said or now - said_at >= PROGRESS_EVERY_S:
            stack.say(
                f"hotseat up: {target.pool}: {state} ({_timing(view, target, now - started)})"
            )
            said, said_at = state, now
        time.sleep(0.1)


def _timing(view: dict[str, object] | None, target: WarmTarget, waited: float) -> str:
    """``3s of ~8s``: the swap's own elapsed time where the controller says it (else the
    time waited so far), and the expected one (measured, else the sims' load time)."""
    elapsed = (view or {}).get("swap_elapsed_s")
    shown = elapsed if isinstance(elapsed, int | float) else waited
    expected = (view or {}).get("swap_expected_s") or target.expected_s
    of = f" of ~{expected:.0f}s" if isinstance(expected, int | float) else ""
    return f"{shown:.0f}s{of}"


def _pool_view(client: httpx.Client, url: str) -> dict[str, object] | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = client.get(url)
        if response.status_code == 200:
            view = response.json()
            return view if isinstance(view, dict) else None
    return None


def _residents(view: dict[str, object]) -> set[str]:
    """The members that serve now (a capacity pool's view lists several)."""
    found: set[str] = set()
    residents = view.get("residents")
    if isinstance(residents, list):
        found.update(r for r in residents if isinstance(r, str))
    resident = view.get("resident")
    if isinstance(resident, str) and view.get("phase") == "idle":
        found.add(resident)
    return found


def _progress(view: dict[str, object] | None, names: str) -> str:
    """What the pool is doing on the way to warm, in a few words."""
    if view is None:
        return f"waiting for the controller to know the pool (to load {names})"
    for step in ("unloading", "loading"):
        member = view.get(step)
        if isinstance(member, str):
            return f"{step} {member}"
    target = view.get("swapping")
    if isinstance(target, str):
        return f"swapping to {target} ({view.get('phase')})"
    return f"{view.get('phase')}, {names} to load next"


def _wait_healthy(stack: Stack, client: httpx.Client, url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_stop()
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{url}/health").status_code == 200:
                return True
        time.sleep(0.05)
    return False


def _serve_until_stopped(stack: Stack) -> int:
    """Block until a signal (exit 0) or until a child dies (exit 1)."""
    while not stack.stop_requested.wait(0.25):
        for proc in stack.procs():
            if not proc.alive():
                stack.say(
                    f"hotseat up: {proc.name} exited with status {proc.popen.returncode}; "
                    f"see {proc.log_path}"
                )
                return EXIT_FAILED
    return EXIT_OK


@dataclass(frozen=True)
class Request:
    """What ``hotseat up`` was asked to run."""

    config: HotseatConfig
    config_path: Path
    ports: Mapping[str, int]
    """Each service's port (missing: its default; 0: any free port)."""
    nats_url: str | None
    redis_url: str | None
    workdir: Path
    installed: Callable[[str], bool]


def _start(stack: Stack, ask: Request) -> None:
    sims, notes = plan_sims(ask.config)
    services, skipped = plan_services(
        ask.ports, ask.workdir, available=ask.installed, binary=_has_binary
    )
    for text in [*notes, *skipped]:
        stack.say(f"hotseat up: {text}")
    for sim in sims:
        if port_in_use(sim.port):
            raise LaunchError(
                f"port {sim.port} for {sim.name} is already in use (the address of backend "
                f"{sim.backend} in the config)"
            )
    for plan in services:
        if port_in_use(plan.port):
            raise LaunchError(
                f"port {plan.port} for the {plan.name} is already in use (another hotseat up?); "
                f"choose another with {PORT_FLAGS[plan.name]} PORT, or 0 for any free port"
            )
    nats_url, redis_url = _start_infra(stack, ask.workdir, ask.nats_url, ask.redis_url)
    logs = ask.workdir / "logs"
    shared = Shared(ask.config_path, nats_url, redis_url, logs, _shared_env())
    _start_sims(stack, sims, shared)
    by_name = {p.name: p for p in services}
    _start_services(stack, [by_name[n] for n in ("audit", "controller") if n in by_name], shared)
    # The members load while the router starts: their progress is shown meanwhile.
    routers = [by_name[n] for n in ("router",) if n in by_name]
    router_tier = _spawn_services(stack, routers, shared)
    if "controller" not in by_name:
        _warm(stack, ask.config, sims)
    else:
        _wait_warm(stack, ask.config, by_name["controller"].url)
    _ready(stack, router_tier, routers)
    router = by_name.get("router")
    target, note = examples(ask.config, sims, router.url if router else None, python=sys.executable)
    _announce(stack, target, note, logs, write_state(dict(stack.lines), logs))


ORDER = ("router", "controller", "audit", "nats", "redis")


def _announce(stack: Stack, target: str, note: str | None, logs: Path, state: Path) -> None:
    """``<name> <url>`` per part (the five named parts first, then the sims), examples."""
    rank = {name: i for i, name in enumerate(ORDER)}
    lines = sorted(stack.lines, key=lambda line: (rank.get(line[0], len(ORDER)), line[0]))
    width = max(len(name) for name, _ in lines)
    stack.say("")
    for name, url in lines:
        stack.say(f"{name.ljust(width)} {url}")
    controller = dict(lines).get("controller")
    if controller is not None:
        stack.say(f"{'console'.ljust(width)} {controller}/ui")  # docs/console.md
    stack.say("")
    stack.say(target)
    if note:
        stack.say(note)
    stack.say(f"hotseat up: logs in {logs}")
    stack.say(f"hotseat up: URLs recorded in {state} (hotseat status and audit read it)")
    stack.say("hotseat up: ready; Ctrl-C (SIGINT) or SIGTERM stops everything")


def installed(module: str) -> bool:
    """True when ``module`` (e.g. ``hotseat_router.main``) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _has_binary(entry_point: str) -> bool:
    try:
        find_binary(entry_point)
    except LaunchError:
        return False
    return True


def run_up(
    *,
    config_path: Path,
    ports: Mapping[str, int] | None = None,
    nats_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
    available: Callable[[str], bool] = installed,
) -> int:
    """Start infrastructure, sim backends and services; stop them all on SIGINT/SIGTERM.
    ``ports`` maps a service to its port (missing: its default, 0: any free port);
    ``nats_url`` / ``redis_url`` name servers to reuse (else ``HOTSEAT_NATS_URL`` /
    ``HOTSEAT_REDIS_URL``; else private ones are launched)."""
    stack = Stack(out or sys.stdout)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        stack.say(f"hotseat up: {exc.source}: invalid ({len(exc.issues)} error(s))")
        for issue in exc.issues:
            stack.say(f"  {issue}")
        return EXIT_FAILED
    except OSError as exc:
        stack.say(f"hotseat up: cannot read {config_path}: {exc}")
        return EXIT_FAILED
    workdir = Path(tempfile.mkdtemp(prefix="hotseat-up-"))
    stack.say(f"hotseat up: config {config_path}; data and logs in {workdir}")
    status = EXIT_OK
    with _signals(stack.stop_requested):
        try:
            ask = Request(
                config,
                config_path.resolve(),
                dict(ports or {}),
                nats_url or os.environ.get("HOTSEAT_NATS_URL") or None,
                redis_url or os.environ.get("HOTSEAT_REDIS_URL") or None,
                workdir,
                available,
            )
            _start(stack, ask)
            status = _serve_until_stopped(stack)
        except Interrupted:
            status = EXIT_INTERRUPTED
        except (LaunchError, httpx.HTTPError, OSError) as exc:
            stack.say(f"hotseat up: failed to start: {exc}")
            status = EXIT_FAILED
        finally:
            stack.say("hotseat up: stopping")
            started = time.monotonic()
            remove_state()
            stack.stop()
            stack.say(f"hotseat up: stopped in {time.monotonic() - started:.1f}s")
    return status


__all__ = ["run_up"]
