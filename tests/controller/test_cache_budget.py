"""Which saved prompt caches are dropped to keep the disk budgets: the pure decision."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hotseat_pool_controller.decisions.cache_budget import CacheFile, decide_drops


def file(member: str, name: str, size: int, used: float) -> CacheFile:
    return CacheFile(member, f"/{member}/{name}", size, used)


def test_nothing_is_dropped_within_the_budgets() -> None:
    """Files that fit both budgets (or no budget at all) all stay."""
    files = [file("a", "1", 10, 1), file("b", "2", 10, 2)]
    assert decide_drops(files, {"a": 10, "b": None}, 20) == []
    assert decide_drops(files, {"a": None, "b": None}, None) == []


def test_a_member_over_its_budget_loses_its_oldest_files_first() -> None:
    """Member a holds 30 bytes against a budget of 15: its two oldest go, b is untouched."""
    old, mid, new = file("a", "old", 10, 1), file("a", "mid", 10, 2), file("a", "new", 10, 3)
    other = file("b", "x", 100, 0)
    assert decide_drops([new, other, old, mid], {"a": 15, "b": None}, None) == [old, mid]


def test_the_pool_budget_drops_the_oldest_across_members() -> None:
    """Within their own budgets, the members' files together exceed the pool's: the
    oldest of the pool go first, whoever saved them."""
    a1, b1, a2, b2 = (
        file("a", "1", 10, 1),
        file("b", "1", 10, 2),
        file("a", "2", 10, 3),
        file("b", "2", 10, 4),
    )
    assert decide_drops([b2, a2, b1, a1], {"a": 100, "b": 100}, 25) == [a1, b1]


def test_a_file_larger_than_its_budget_is_dropped_however_new() -> None:
    """A member whose one (newest) file is larger than its budget keeps nothing."""
    big = file("a", "big", 50, 9)
    assert decide_drops([big], {"a": 40}, None) == [big]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 50), st.integers(0, 20)),
        max_size=12,
        unique_by=lambda t: (t[0], t[2]),
    ),
    st.dictionaries(st.sampled_from("abc"), st.none() | st.integers(0, 120)),
    st.none() | st.integers(0, 200),
)
def test_after_the_drops_every_budget_holds(
    specs: list[tuple[str, int, int]], budgets: dict[str, int | None], pool: int | None
) -> None:
    """Whatever the files and budgets: the kept files fit every budget, each file is
    dropped at most once, and nothing is dropped when everything fits already."""
    files = [file(m, str(used), size, used) for m, size, used in specs]
    dropped = decide_drops(files, budgets, pool)
    kept = [f for f in files if f not in dropped]
    for member, budget in budgets.items():
        if budget is not None:
            assert sum(f.size for f in kept if f.member == member) <= budget
    if pool is not None:
        assert sum(f.size for f in kept) <= pool
    assert len(dropped) == len(set(dropped))
    fits = all(
        budget is None or sum(f.size for f in files if f.member == member) <= budget
        for member, budget in budgets.items()
    ) and (pool is None or sum(f.size for f in files) <= pool)
    assert not (fits and dropped)
