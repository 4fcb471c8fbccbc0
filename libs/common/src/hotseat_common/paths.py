"""Where Hotseat keeps files on a host: the state directory and each member's saved slots.

The pool controller's drivers and the sim resolve these from the same config, so both
sides of a slot save agree on the directory without being told.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotseat_common.config.model import Pool, PoolMember, ProcessDriver


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/hotseat``, else ``~/.local/state/hotseat``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hotseat"


def slot_dir(pool: Pool, member: PoolMember) -> Path:
    """The member's directory of saved prompt caches: its ``cache.dir``, else
    ``<dataDir>/<pool>/slots/<member>`` (the process driver's ``dataDir``, else the default
    state directory)."""
    if member.cache is not None and member.cache.directory:
        return Path(member.cache.directory).expanduser()
    data_dir = pool.driver.data_dir if isinstance(pool.driver, ProcessDriver) else None
    base = Path(data_dir).expanduser() if data_dir else default_data_dir()
    return base / pool.name / "slots" / member.name
