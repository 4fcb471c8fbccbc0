"""A ``process`` member as the driver runs it: its command, environment and working
directory expanded (:mod:`.expansion`), its health and slots URLs, its address, its log
and pid files."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hotseat_common.config.model import HotseatConfig, Pool, PoolMember
from hotseat_common.config.model import ProcessMember as ProcessMemberConfig
from hotseat_common.paths import default_data_dir, slot_dir
from hotseat_pool_controller.drivers.base import DriverError
from hotseat_pool_controller.drivers.expansion import expand
from hotseat_pool_controller.drivers.model_identity import model_argument

SLOT_SAVE_PATH = "--slot-save-path"

__all__ = ["MemberProcess", "default_data_dir"]


@dataclass(frozen=True)
class MemberProcess:
    """One member, resolved from the config."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None
    health_url: str
    slots_url: str
    host: str
    port: int
    log_path: Path
    pid_path: Path
    unset: tuple[str, ...] = ()
    """Variables named by the command, ``cwd``, ``logFile`` or ``cache.modelFile`` that
    are not set."""
    slot_dir: Path | None = None
    """Where its slots are saved, when it carries its prompt cache over swaps (the
    command then ends with ``--slot-save-path`` and this directory)."""
    model_path: Path | None = None
    """The model file whose identity keys its saved slots (``cache.modelFile``, else the
    command's ``-m``), relative paths taken from ``cwd``."""

    @classmethod
    def from_config(
        cls, config: HotseatConfig, pool: Pool, member: PoolMember, data_dir: Path
    ) -> MemberProcess:
        if member.process is None:
            raise DriverError(f"pool {pool.name}: member {member.name} has no process block")
        backend = config.member_backend(pool.name, member.name)
        base = backend.address if backend is not None else None
        health = member.process.health_url or (base + "/health" if base else None)
        if health is None:
            raise DriverError(
                f"pool {pool.name}: member {member.name} needs a healthUrl or a backend"
            )
        resolved = _resolve(member.process, member.cache.model_file if member.cache else None)
        log_file = Path(resolved.log_file or f"{member.name}.log")
        host, port = _address(base or health)
        carries = member.cache is not None and member.cache.carry_over
        saves_to = slot_dir(pool, member) if carries else None
        argv = resolved.argv
        if saves_to is not None:
            argv = (*argv, SLOT_SAVE_PATH, str(saves_to))
        model = resolved.model_file or model_argument(resolved.argv)
        model_path = None
        if model is not None:
            model_path = Path(model).expanduser()
            if not model_path.is_absolute() and resolved.cwd is not None:
                model_path = Path(resolved.cwd) / model_path
        return cls(
            name=member.name,
            argv=argv,
            env=resolved.env,
            cwd=resolved.cwd,
            health_url=health,
            slots_url=member.process.slots_url or (base or health.rsplit("/", 1)[0]) + "/slots",
            host=host,
            port=port,
            log_path=log_file if log_file.is_absolute() else data_dir / log_file,
            pid_path=data_dir / f"{member.name}.pid",
            unset=resolved.unset,
            slot_dir=saves_to,
            model_path=model_path,
        )

    def executable(self) -> str:
        """The command's executable, found as the member would run it."""
        if self.unset:
            names = ", ".join("${" + name + "}" for name in self.unset)
            raise DriverError(
                f"{self.name}: its command, cwd or logFile uses {names}, not set in the "
                "controller's environment (give a default with ${NAME:-default})"
            )
        command = self.argv[0]
        path = self.env.get("PATH", os.environ.get("PATH"))
        if os.sep in command and self.cwd is not None:
            command = str(Path(self.cwd) / command)
        found = shutil.which(command, path=path)
        if found is None:
            raise DriverError(
                f"{self.name}: cannot start {self.argv[0]!r}: not found or not executable"
                + ("" if os.sep in self.argv[0] else " on PATH")
            )
        return found


@dataclass(frozen=True)
class _Resolved:
    env: dict[str, str]
    argv: tuple[str, ...]
    cwd: str | None
    log_file: str | None
    model_file: str | None
    unset: tuple[str, ...]


def _resolve(member: ProcessMemberConfig, model_file: str | None) -> _Resolved:
    """The member's env, then its argv, ``cwd``, ``logFile`` and the cache's model file,
    expanded (see expansion)."""
    unset: set[str] = set()

    def one(value: str, scope: Mapping[str, str]) -> str:
        expanded = expand(value, scope)
        unset.update(expanded.missing)
        return expanded.value

    env = {key: one(value, os.environ) for key, value in member.env.items()}
    scope = {**os.environ, **env}
    return _Resolved(
        env=env,
        argv=tuple(one(arg, scope) for arg in member.command),
        cwd=None if member.cwd is None else one(member.cwd, scope),
        log_file=None if member.log_file is None else one(member.log_file, scope),
        model_file=None if model_file is None else one(model_file, scope),
        unset=tuple(sorted(unset)),
    )


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "127.0.0.1", port
