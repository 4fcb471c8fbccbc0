"""Operating-system facts the ``process`` driver relies on: process groups, pid files, ports.

A member runs in its own session, so its process group id is the leader's pid and one
signal reaches the whole tree (a wrapper script, a server and its workers). A pid file
per member records the leader's pid and creation time, so a driver that did not start the
process (a restarted controller, a standby replica on the same host) can find it and tell
it apart from an unrelated process that reused the pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

CREATE_TIME_TOLERANCE_S = 0.05
"""Two creation times this close belong to the same process (psutil rounds to clock ticks)."""
LOG_MARKER = "--- hotseat: starting"
"""Start of the line the driver writes to a member's log before each start."""


@dataclass(frozen=True)
class PidRecord:
    """What a pid file says about a member's process."""

    pid: int
    create_time: float
    epoch: int
    argv: tuple[str, ...]

    def dumps(self) -> str:
        return json.dumps(
            {
                "pid": self.pid,
                "create_time": self.create_time,
                "epoch": self.epoch,
                "argv": list(self.argv),
            }
        )

    @classmethod
    def loads(cls, text: str) -> PidRecord:
        data = json.loads(text)
        return cls(
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            epoch=int(data["epoch"]),
            argv=tuple(str(a) for a in data["argv"]),
        )


def write_pid_file(path: Path, record: PidRecord) -> None:
    """Write ``record`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.dumps() + "\n")
    tmp.replace(path)


def read_pid_file(path: Path) -> PidRecord | None:
    """The record in ``path``; ``None`` when there is none or it cannot be parsed."""
    try:
        return PidRecord.loads(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_pid_file(path: Path, record: PidRecord | None = None) -> None:
    """Remove ``path``; with ``record``, only if it still describes that process."""
    if record is not None and read_pid_file(path) not in (record, None):
        return  # another start wrote its own record meanwhile
    with contextlib.suppress(OSError):  # a stale file is recognised as stale later
        path.unlink()


def create_time(pid: int) -> float | None:
    """When ``pid`` was created (epoch seconds), as psutil reports it; None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_alive(pid: int, created: float) -> bool:
    """True when ``pid`` runs (not a zombie) and is the process created at ``created``."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > CREATE_TIME_TOLERANCE_S:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pid_reused(pid: int, created: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - created) > CREATE_TIME_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False  # the leader is reaped; members of its group may linger
    except psutil.Error:
        return True  # not ours to look at


def group_members(pgid: int, created: float) -> list[int]:
    """Live (non-zombie) processes of the group whose leader is ``pgid``, created at
    ``created``; empty once the tree is gone.

    Linux hands out no pid still used as a group id, so while any member lives the id is
    ours; once the leader's pid belongs to another process, the group is not ours.
    """
    if _pid_reused(pgid, created):
        return []  # our group is long gone
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # the common case once a member is gone: no scan needed
    except PermissionError:
        pass  # someone else's group with that id; the scan below decides
    members: list[int] = []
    for proc in psutil.process_iter(["status", "create_time"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue  # already dead; its parent (or init) reaps it
        if proc.info["create_time"] + CREATE_TIME_TOLERANCE_S < created:
            continue  # an older process: not part of the tree we started
        members.append(proc.pid)
    return members


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to every process of group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


async def port_accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def log_tail(path: Path, *, max_lines: int = 20, max_bytes: int = 8192) -> str:
    """The last lines ``path`` received since the driver's last start marker."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - max_bytes))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(LOG_MARKER)]
    if starts:
        lines = lines[starts[-1] + 1 :]
    return "\n".join(lines[-max_lines:])
