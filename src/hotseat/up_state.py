"""Where a running ``hotseat up`` says its parts listen, so the other commands find them.

``hotseat up`` writes ``up.json`` in the state directory (``HOTSEAT_STATE_DIR``, else
``~/.hotseat``) once the stack is ready, and removes it when it stops. ``hotseat status``
and ``hotseat audit`` read it when neither ``--url`` nor their environment variable is
given, so they talk to the stack that runs, whatever port it got. A file left behind by a
stack that was killed is ignored (its process is gone)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

STATE_FILE = "up.json"


def state_dir() -> Path:
    return Path(os.environ.get("HOTSEAT_STATE_DIR") or Path.home() / ".hotseat")


def state_path() -> Path:
    return state_dir() / STATE_FILE


def write_state(parts: Mapping[str, str], logs: Path) -> Path:
    """Record this process's stack: ``parts`` maps a part's name to its URL."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "parts": dict(parts), "logs": str(logs)}))
    tmp.replace(path)
    return path


def remove_state() -> None:
    """Remove the record if it is this process's (another stack may have written since)."""
    path = state_path()
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_url(part: str) -> str | None:
    """The URL of ``part`` (``controller``, ``audit``, ``router``...) of the running
    ``hotseat up``, or ``None`` when none runs or it has no such part."""
    try:
        state = json.loads(state_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not _alive(state.get("pid")):
        return None
    parts = state.get("parts")
    url = parts.get(part) if isinstance(parts, dict) else None
    return url if isinstance(url, str) else None


def default_url(part: str, env: str, fallback: str) -> str:
    """``env`` if set, else the running ``hotseat up``'s ``part``, else ``fallback``."""
    return os.environ.get(env) or running_url(part) or fallback
