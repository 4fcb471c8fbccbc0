"""What one sim impersonates: a backend of the config, its pool member and simulated GPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotseat_common.config import HotseatConfig
from hotseat_common.config.model import SimDriver, SimMember
from hotseat_common.paths import slot_dir


class ProfileError(ValueError):
    """The config has no backend by that name."""


@dataclass(frozen=True, slots=True)
class SimProfile:
    """The sim's identity and timing, resolved once from the config."""

    backend: str
    model: str
    """Model name listed by ``/v1/models`` and used when a request names none."""
    member: str
    """Pool member name; the backend's name when it is not pooled."""
    pool: str | None
    """The pool (and simulated GPU) this member belongs to; None when unpooled."""
    capacity_gib: float | None
    """The GPU's memory for admission; None when the pool's driver declares none."""
    sim: SimMember
    slot_dir: Path | None = None
    """Where slots are saved and restored (llama.cpp's ``--slot-save-path``): the member's
    cache directory when it carries its cache over swaps; None answers 501, as a server
    started without the flag does."""

    @property
    def gpu(self) -> str | None:
        """The simulated GPU's name in the ledger: the pool name."""
        return self.pool


def resolve_profile(config: HotseatConfig, backend_name: str) -> SimProfile:
    """The profile of ``backend_name``; pooled members take their ``sim`` block's timing."""
    backend = config.backend(backend_name)
    if backend is None:
        known = ", ".join(b.name for b in config.backends) or "none"
        raise ProfileError(f"no backend named {backend_name!r} in the config (known: {known})")
    model = backend.model or backend.name
    if backend.pool is None:
        return SimProfile(backend.name, model, backend.name, None, None, SimMember())
    pool = config.pool(backend.pool.name)
    member = pool.member(backend.pool.member) if pool is not None else None
    sim = member.sim if member is not None and member.sim is not None else SimMember()
    capacity: float | None = None
    if pool is not None and isinstance(pool.driver, SimDriver):
        capacity = pool.driver.gpu_memory_gi_b
    if pool is not None and pool.capacity is not None:
        # A capacity pool's memory is the simulated GPU's (docs/adr/0008), and a member's
        # declared memoryGiB is what its sim holds, whichever driver runs the sims.
        capacity = pool.capacity.total_gib
        if member is not None and member.memory_gi_b is not None:
            sim = sim.model_copy(update={"memory_gi_b": member.memory_gi_b})
    saves = None
    if pool is not None and member is not None and member.cache and member.cache.carry_over:
        saves = slot_dir(pool, member)
    return SimProfile(
        backend.name, model, backend.pool.member, backend.pool.name, capacity, sim, saves
    )
