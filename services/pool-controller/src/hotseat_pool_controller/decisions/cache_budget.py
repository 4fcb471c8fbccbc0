"""Which saved prompt caches to drop so that every member's files, and the pool's as a
whole, fit their disk budgets: the least recently used first (docs/adr/0007)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheFile:
    """One saved slot on disk."""

    member: str
    name: str
    """The file's path (unique across the pool)."""
    size: int
    used: float
    """When it was last written or restored (its modification time)."""


def _oldest_first(files: Iterable[CacheFile]) -> list[CacheFile]:
    return sorted(files, key=lambda f: (f.used, f.name))


def _over(files: list[CacheFile], budget: int) -> list[CacheFile]:
    """The oldest of ``files`` to drop until the rest fit ``budget``."""
    total = sum(f.size for f in files)
    dropped: list[CacheFile] = []
    for file in files:
        if total <= budget:
            break
        dropped.append(file)
        total -= file.size
    return dropped


def decide_drops(
    files: Iterable[CacheFile],
    member_budgets: Mapping[str, int | None],
    pool_budget: int | None,
) -> list[CacheFile]:
    """The files to delete: each member's oldest beyond its own budget, then the pool's
    oldest beyond the pool's. A file larger than a budget goes whatever its age."""
    ordered = _oldest_first(files)
    dropped: list[CacheFile] = []
    for member, budget in member_budgets.items():
        if budget is not None:
            dropped += _over([f for f in ordered if f.member == member], budget)
    if pool_budget is not None:
        kept = [f for f in ordered if f not in dropped]
        dropped += _over(kept, pool_budget)
    return _oldest_first(dropped)
