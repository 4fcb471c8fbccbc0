"""Signals for processes a test started itself (never anything found by name).

Every helper takes a :class:`hotseat.launcher.Managed`, so a test can only freeze, thaw or
kill a process it launched::

    with frozen(stack.routers[0]):      # SIGSTOP now, SIGCONT when the block ends
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import psutil

from hotseat.launcher import Managed


def kill(proc: Managed) -> None:
    """SIGKILL and reap."""
    proc.kill()


def freeze(proc: Managed) -> None:
    """SIGSTOP: the process keeps its sockets but runs no code (a stalled event loop)."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGSTOP)


def thaw(proc: Managed) -> None:
    """SIGCONT."""
    if proc.alive():
        os.kill(proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def frozen(proc: Managed) -> Iterator[Managed]:
    """SIGSTOP for the duration of the block; SIGCONT afterwards, even on failure."""
    freeze(proc)
    try:
        yield proc
    finally:
        thaw(proc)


def rss_bytes(proc: Managed) -> int:
    """Resident memory of the process."""
    return int(psutil.Process(proc.pid).memory_info().rss)


def is_stopped(proc: Managed) -> bool:
    return psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED
