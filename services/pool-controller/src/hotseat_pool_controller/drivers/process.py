"""The ``process`` driver: a member is a local server process, started to load, stopped to unload.

Load: start the member's command (an argv list, no shell; ``${NAME}``, ``${NAME:-default}``
and a leading ``~`` expanded, see :mod:`.expansion`) in its own session, output
appended to its log file, a pid file written; ready once its health URL answers 200
(llama.cpp answers 503 while the model loads). A process that exits first is an error
carrying the tail of its log.

Unload, written for servers that hang on SIGTERM while a request is in flight (llama.cpp's
``llama-server`` does):

1. SIGTERM to the member's whole process group.
2. Wait up to ``stopGracePeriod`` for the leader to be reaped and the group to be empty.
3. SIGKILL the group, and wait (bounded) until it is empty.
4. Wait until the member's port refuses connections.

Only then does ``unload`` return, so the next load never meets the old process.

Fencing: every start and every stop passes the pool's host-local epoch fence first
(:mod:`.fence`): a command from a swap owner older than one that already acted here is
refused, so a controller frozen past its heartbeat cannot kill or start a member once it
thaws. A controller shutting down stops the members it started only if no newer owner
has acted on the pool since.

Prompt caches (``cache.carryOver``, docs/adr/0007): the command gets ``--slot-save-path``
and the member's slot directory; the key of its saved slots is computed when the process
starts (the model file's identity, the command line, the executable). Its slots are saved
under that key only while the model file is still the one it started with, and restored
only then.

Scope: one host. A driver can only signal processes on its own host; the pid file lets
another driver on the same host (a restarted controller, a standby replica) find and stop
a member it did not start. Run the controller as a single replica, or active/standby on
the host that runs the members.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_common.config.model import ProcessDriver as ProcessDriverConfig
from hotseat_common.logging import get_logger
from hotseat_pool_controller.drivers import processgroup
from hotseat_pool_controller.drivers.base import (
    NOT_RUNNING,
    CacheFailure,
    CacheReport,
    DriverError,
    Fenced,
)
from hotseat_pool_controller.drivers.fence import EpochFence
from hotseat_pool_controller.drivers.model_identity import (
    IdentityError,
    cache_key,
    executable_identity,
    file_identity,
    modified_after,
)
from hotseat_pool_controller.drivers.probes import fetch_idle
from hotseat_pool_controller.drivers.process_spec import (
    SLOT_SAVE_PATH,
    MemberProcess,
    default_data_dir,
)
from hotseat_pool_controller.drivers.processgroup import PidRecord
from hotseat_pool_controller.drivers.slot_cache import CarriesSlotCaches, SlotCaches

__all__ = ["ProcessDriver"]

log = get_logger(__name__)

POLL_INTERVAL_S = 0.05
"""How often readiness, exit and port release are checked when no event says so."""
KILL_CONFIRM_TIMEOUT_S = 10.0
"""How long a SIGKILLed group may take to disappear (a process stuck in the kernel)."""
PORT_RELEASE_TIMEOUT_S = 5.0
"""How long the port may keep accepting connections once the process group is gone."""
HEALTH_ATTEMPTS_BEFORE_RESTART = 3
"""Health probes a running, once-ready member must fail before a load restarts it."""
HTTP_TIMEOUT = httpx.Timeout(2.0, connect=1.0)


@dataclass
class _Running:
    """A member's process: started here (``proc`` set) or found through its pid file."""

    record: PidRecord
    proc: asyncio.subprocess.Process | None = None
    exited: asyncio.Task[int] | None = None
    was_ready: bool = False
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    """The model file's identity when the process started (prompt-cache carry-over)."""
    key: str | None = None
    """The key of its saved slots (docs/adr/0007)."""

    @property
    def pid(self) -> int:
        return self.record.pid

    def alive(self) -> bool:
        if self.exited is not None:
            return not self.exited.done()
        return processgroup.is_alive(self.record.pid, self.record.create_time)

    def exit_code(self) -> int | None:
        if self.exited is not None and self.exited.done() and not self.exited.cancelled():
            return self.exited.result()
        return None

    async def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the leader to exit (and be reaped); True if it did."""
        if self.exited is not None:
            done, _ = await asyncio.wait({self.exited}, timeout=timeout)
            return bool(done)
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL_S)
        return True


class ProcessDriver(CarriesSlotCaches):
    """Runs each member as a local process; see the module docstring for the algorithm."""

    def __init__(self, config: HotseatConfig, pool: Pool) -> None:
        if not isinstance(pool.driver, ProcessDriverConfig):
            raise DriverError(f"pool {pool.name}: not a process pool")
        self._pool = pool.name
        self._grace = pool.driver.stop_grace_period
        self._ready_timeout = pool.driver.ready_timeout
        data_dir = Path(pool.driver.data_dir) if pool.driver.data_dir else default_data_dir()
        self._dir = data_dir.expanduser() / pool.name
        self._specs = {
            member.name: MemberProcess.from_config(config, pool, member, self._dir)
            for member in pool.members
        }
        self._running: dict[str, _Running] = {}
        self._locks = {name: asyncio.Lock() for name in self._specs}
        self._fence = EpochFence(self._dir / "fence")
        self._client = httpx.AsyncClient(
            timeout=HTTP_TIMEOUT, limits=httpx.Limits(max_connections=32), trust_env=False
        )
        self._caches = SlotCaches(pool)

    # --- the ResidencyDriver interface ------------------------------------------------

    async def load(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            run = self._find(spec)
            if run is not None and run.alive():
                if await self._health_ok(spec, attempts=HEALTH_ATTEMPTS_BEFORE_RESTART):
                    run.was_ready = True
                    return
                if not run.was_ready:  # still starting (a load that was cancelled earlier)
                    await self._wait_ready(spec, run, epoch)
                    return
                log.warning("process_member_unhealthy_restart", pool=self._pool, member=member)
            if run is not None:
                await self._stop(spec, run, epoch=epoch)
            run = await self._start(spec, epoch)
            await self._wait_ready(spec, run, epoch)

    async def unload(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            run = self._find(spec)
            if run is not None:
                await self._stop(spec, run, epoch=epoch)
            else:
                await self._confirm_port_released(spec)

    async def is_ready(self, member: str) -> bool:
        spec = self._spec(member)
        run = self._find(spec)
        if run is None or not run.alive():
            return False
        ready = await self._health_ok(spec) and run.alive()
        run.was_ready = run.was_ready or ready
        return ready

    async def fence(self, epoch: int) -> None:
        async with self._fence.hold(epoch, "rebuild"):
            pass

    async def confirm_gone(self, member: str) -> bool:
        """Gone when no process of the member's group is left (a stalled one is not)."""
        spec = self._spec(member)
        run = self._find(spec)
        return run is None or (not run.alive() and not await self._members(run))

    async def is_idle(self, member: str) -> bool:
        spec = self._spec(member)
        run = self._find(spec)
        if run is None or not run.alive():
            raise DriverError(f"{member}: not running, no slots to ask")
        return await fetch_idle(self._client, member, spec.slots_url)

    async def residency(self) -> dict[str, bool]:
        result: dict[str, bool] = {}
        for name, spec in self._specs.items():
            run = self._find(spec)
            result[name] = run is not None and run.alive()
        return result

    async def aclose(self) -> None:
        """Stop every member this driver started or found, then close the HTTP client.

        Takes no member lock: a load still waiting for readiness sees its process go and
        fails, rather than holding the shutdown up.
        """
        try:
            runs = list(self._running.items())
            results = await asyncio.gather(
                *(self._stop(self._specs[name], run, epoch=None) for name, run in runs),
                return_exceptions=True,
            )
            for (name, _), result in zip(runs, results, strict=True):
                if isinstance(result, Fenced):
                    log.info("process_member_left_to_newer_owner", pool=self._pool,
                             member=name, reason=str(result))  # fmt: skip
                elif isinstance(result, BaseException):
                    log.error("process_member_stop_failed", pool=self._pool, member=name,
                              error=str(result))  # fmt: skip
        finally:
            await self._client.aclose()
            await self._caches.aclose()

    # --- prompt caches (docs/adr/0007) --------------------------------------------------

    async def _carry(self, member: str, action: Literal["save", "restore"]) -> CacheReport:
        spec = self._spec(member)
        run = self._find(spec)
        if run is None or not run.alive():
            return CacheReport(member, action, note=NOT_RUNNING)
        key = await asyncio.to_thread(self._running_key, spec, run)
        if isinstance(key, tuple):
            return self._caches.skipped(member, action, *key)
        base = spec.slots_url.rsplit("/", 1)[0]
        return await self._caches.step(action, member, base, key)

    def _running_key(self, spec: MemberProcess, run: _Running) -> str | tuple[CacheFailure, str]:
        """The key of the running process's slots, or why none can be trusted: its model
        file changed since it started, or it was started without a slot directory."""
        model = spec.model_path
        if model is None:
            return CacheFailure.ERROR, "no model file to identify (cache.modelFile)"
        if SLOT_SAVE_PATH not in run.record.argv:
            return CacheFailure.UNSUPPORTED, f"the process was started without {SLOT_SAVE_PATH}"
        if run.key is None and modified_after(model, run.record.create_time):
            return CacheFailure.MODEL_CHANGED, f"{model} changed after the process started"
        try:
            identity = file_identity(model)
        except IdentityError as exc:
            return CacheFailure.ERROR, str(exc)
        if run.key is not None and identity != run.model:
            return CacheFailure.MODEL_CHANGED, f"{model} changed after the process started"
        if run.key is None:
            run.model, run.key = identity, self._key(spec, identity, run.record.argv)
        return run.key

    def _key(self, spec: MemberProcess, identity: str, argv: tuple[str, ...]) -> str:
        path = spec.env.get("PATH", os.environ.get("PATH"))
        return cache_key([identity, executable_identity(argv[0], path), *argv])

    def _stamp(self, spec: MemberProcess) -> tuple[str | None, str | None]:
        """Right before a start: the model's identity and the key of the slots the process
        will save (none when it carries no cache, or its model file cannot be read)."""
        if spec.slot_dir is None or spec.model_path is None:
            return None, None
        try:
            model = file_identity(spec.model_path)
        except IdentityError as exc:
            log.warning("process_member_model_unreadable", pool=self._pool, member=spec.name,
                        error=str(exc))  # fmt: skip
            return None, None
        return model, self._key(spec, model, spec.argv)

    # --- internals --------------------------------------------------------------------

    def _spec(self, member: str) -> MemberProcess:
        try:
            return self._specs[member]
        except KeyError:
            raise DriverError(f"pool {self._pool}: no member {member!r}") from None

    def _find(self, spec: MemberProcess) -> _Running | None:
        """This member's process: the one started here, else the one in its pid file."""
        run = self._running.get(spec.name)
        if run is not None:
            return run
        record = processgroup.read_pid_file(spec.pid_path)
        if record is None:
            return None
        alive = processgroup.is_alive(record.pid, record.create_time)
        if not alive and not processgroup.group_members(record.pid, record.create_time):
            processgroup.remove_pid_file(spec.pid_path, record)
            return None
        log.info("process_member_found", pool=self._pool, member=spec.name, pid=record.pid,
                 alive=alive, epoch=record.epoch)  # fmt: skip
        run = _Running(record=record)
        self._running[spec.name] = run
        return run

    async def _health_ok(self, spec: MemberProcess, *, attempts: int = 1) -> bool:
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(POLL_INTERVAL_S * 2)
            try:
                response = await self._client.get(spec.health_url)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                return True
        return False

    async def _start(self, spec: MemberProcess, epoch: int) -> _Running:
        executable = spec.executable()
        if await processgroup.port_accepts(spec.host, spec.port):
            raise DriverError(
                f"{spec.name}: {spec.host}:{spec.port} already accepts connections but no "
                "process of this member is known; stop whatever listens there first"
            )
        try:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            spec.pid_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = spec.log_path.open("ab")
        except OSError as exc:
            raise DriverError(f"{spec.name}: cannot open its log or data dir: {exc}") from exc
        if spec.slot_dir is not None:
            try:
                await self._caches.prepare(spec.name)
            except OSError as exc:
                raise DriverError(f"{spec.name}: cannot create {spec.slot_dir}: {exc}") from exc
        model, key = await asyncio.to_thread(self._stamp, spec)
        with log_file:
            async with self._fence.hold(epoch, f"start {spec.name}"):
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                header = f"{processgroup.LOG_MARKER} {spec.name} (epoch {epoch}) at {stamp}: "
                log_file.write((header + " ".join(spec.argv) + "\n").encode())
                log_file.flush()
                try:
                    proc = await asyncio.create_subprocess_exec(
                        executable,
                        *spec.argv[1:],
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **spec.env},
                        cwd=spec.cwd,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise DriverError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}") from exc
        exited = asyncio.create_task(proc.wait(), name=f"process-{self._pool}-{spec.name}-exit")
        created = processgroup.create_time(proc.pid) or time.time()  # None: exited already
        record = PidRecord(pid=proc.pid, create_time=created, epoch=epoch, argv=spec.argv)
        run = _Running(record=record, proc=proc, exited=exited, model=model, key=key)
        self._running[spec.name] = run
        try:
            processgroup.write_pid_file(spec.pid_path, record)
        except OSError as exc:
            await self._stop(spec, run, epoch=epoch)
            raise DriverError(f"{spec.name}: cannot write {spec.pid_path}: {exc}") from exc
        log.info("process_member_started", pool=self._pool, member=spec.name, pid=proc.pid,
                 epoch=epoch, log=str(spec.log_path))  # fmt: skip
        return run

    async def _wait_ready(self, spec: MemberProcess, run: _Running, epoch: int) -> None:
        deadline = None if self._ready_timeout is None else run.started + self._ready_timeout
        while True:
            if not run.alive():
                await self._stop(spec, run, epoch=epoch, confirm_port=False)
                code = run.exit_code()
                raise DriverError(
                    f"{spec.name}: exited before ready"
                    + (f" (exit code {code})" if code is not None else "")
                    + f"; last lines of {spec.log_path}:\n"
                    + processgroup.log_tail(spec.log_path)
                )
            if await self._health_ok(spec) and run.alive():
                run.was_ready = True
                log.info("process_member_ready", pool=self._pool, member=spec.name,
                         pid=run.pid, seconds=round(time.monotonic() - run.started, 3))  # fmt: skip
                return
            if deadline is not None and time.monotonic() >= deadline:
                await self._stop(spec, run, epoch=epoch)
                raise DriverError(
                    f"{spec.name}: not ready after {self._ready_timeout}s (readyTimeout); "
                    f"stopped it. Last lines of {spec.log_path}:\n"
                    + processgroup.log_tail(spec.log_path)
                )
            await run.wait_exit(POLL_INTERVAL_S)  # wakes at once when the process exits

    async def _stop(
        self, spec: MemberProcess, run: _Running, *, epoch: int | None, confirm_port: bool = True
    ) -> None:
        """SIGTERM the group (through the epoch fence), SIGKILL after the grace period,
        confirm the group is gone. ``epoch`` ``None``: a shutdown, under the highest epoch
        this driver acted under."""
        pgid = run.pid  # a session leader's group id is its pid
        began = time.monotonic()
        if await self._members(run):
            async with self._fence.hold(epoch, f"stop {spec.name}"):
                processgroup.signal_group(pgid, signal.SIGTERM)
            log.info("process_member_stopping", pool=self._pool, member=spec.name, pid=pgid)
        if not await self._group_gone(run, self._grace):
            processgroup.signal_group(pgid, signal.SIGKILL)
            log.warning("process_member_killed", pool=self._pool, member=spec.name, pid=pgid,
                        grace_s=self._grace)  # fmt: skip
            if not await self._group_gone(run, KILL_CONFIRM_TIMEOUT_S):
                raise DriverError(
                    f"{spec.name}: processes {await self._members(run)} survive SIGKILL"
                )
        self._running.pop(spec.name, None)
        processgroup.remove_pid_file(spec.pid_path, run.record)
        if confirm_port:
            await self._confirm_port_released(spec)
        log.info("process_member_stopped", pool=self._pool, member=spec.name, pid=pgid,
                 exit_code=run.exit_code(), seconds=round(time.monotonic() - began, 3))  # fmt: skip

    async def _members(self, run: _Running) -> list[int]:
        return await asyncio.to_thread(processgroup.group_members, run.pid, run.record.create_time)

    async def _group_gone(self, run: _Running, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not await run.wait_exit(timeout):
            return False
        while await self._members(run):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL_S)
        return True

    async def _confirm_port_released(self, spec: MemberProcess) -> None:
        deadline = time.monotonic() + PORT_RELEASE_TIMEOUT_S
        while await processgroup.port_accepts(spec.host, spec.port):
            if time.monotonic() >= deadline:
                raise DriverError(
                    f"{spec.name}: {spec.host}:{spec.port} still accepts connections with no "
                    "process of this member running (something else listens there)"
                )
            await asyncio.sleep(POLL_INTERVAL_S)
