"""Cross-reference checks that no single field can make: names that must exist or be unique.

They read the raw mapping (not the validated model) so that they still run, and still
report, when some fields of the same file are invalid: a user sees every error at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hotseat_common.config.errors import ConfigIssue


def _items(raw: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = raw.get(key)
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)]


def _name(item: Mapping[str, Any]) -> str | None:
    name = item.get("name")
    return name if isinstance(name, str) else None


def _unique(path: str, items: list[tuple[int, Mapping[str, Any]]]) -> Iterator[ConfigIssue]:
    seen: dict[str, int] = {}
    for i, item in items:
        name = _name(item)
        if name is None:
            continue
        if name in seen:
            yield ConfigIssue(
                f"{path}[{i}].name", f"{name!r} is already used by {path}[{seen[name]}]"
            )
        else:
            seen[name] = i


def _known(names: list[str]) -> str:
    return ", ".join(dict.fromkeys(names)) if names else "none declared"


def cross_check(raw: Mapping[str, Any]) -> list[ConfigIssue]:
    """Every cross-reference error in ``raw``, in file order."""
    backends = _items(raw, "backends")
    pools = _items(raw, "pools")
    rules = _items(raw, "rules")
    issues: list[ConfigIssue] = []
    issues += _unique("backends", backends)
    issues += _unique("pools", pools)
    issues += _unique("rules", rules)
    pool_members: dict[str, list[str]] = {}
    for i, pool in pools:
        issues += _check_pool(i, pool, pool_members)
    issues += _check_backend_pools(backends, pool_members)
    backend_names = [n for _, b in backends if (n := _name(b)) is not None]
    issues += _check_rules(rules, backend_names)
    default_route = raw.get("defaultRoute")
    if isinstance(default_route, str) and default_route not in backend_names:
        issues.append(
            ConfigIssue(
                "defaultRoute",
                f"{default_route!r} is not a declared backend (backends: {_known(backend_names)})",
            )
        )
    return issues


def _check_pool(
    index: int, pool: Mapping[str, Any], pool_members: dict[str, list[str]]
) -> Iterator[ConfigIssue]:
    members = _items(pool, "members")
    yield from _unique(f"pools[{index}].members", members)
    names = [n for _, m in members if (n := _name(m)) is not None]
    if (pool_name := _name(pool)) is not None:
        pool_members[pool_name] = names
    default = pool.get("default")
    if isinstance(default, str) and default not in names:
        yield ConfigIssue(
            f"pools[{index}].default",
            f"{default!r} is not a member of this pool (members: {_known(names)})",
        )
    yield from _driver_blocks(index, pool, members)


def _check_backend_pools(
    backends: list[tuple[int, Mapping[str, Any]]], pool_members: dict[str, list[str]]
) -> Iterator[ConfigIssue]:
    fronted: dict[tuple[str, str], str] = {}
    for i, backend in backends:
        ref = backend.get("pool")
        if not isinstance(ref, Mapping):
            continue
        pool_name, member = ref.get("name"), ref.get("member")
        if not isinstance(pool_name, str) or not isinstance(member, str):
            continue
        if pool_name not in pool_members:
            yield ConfigIssue(
                f"backends[{i}].pool.name",
                f"{pool_name!r} is not a declared pool (pools: {_known(list(pool_members))})",
            )
        elif member not in pool_members[pool_name]:
            yield ConfigIssue(
                f"backends[{i}].pool.member",
                f"{member!r} is not a member of pool {pool_name!r} "
                f"(members: {_known(pool_members[pool_name])})",
            )
        elif (pool_name, member) in fronted:
            yield ConfigIssue(
                f"backends[{i}].pool",
                f"member {pool_name}/{member} is already fronted by backend "
                f"{fronted[(pool_name, member)]!r}",
            )
        elif (name := _name(backend)) is not None:
            fronted[(pool_name, member)] = name


def _check_rules(
    rules: list[tuple[int, Mapping[str, Any]]], backend_names: list[str]
) -> Iterator[ConfigIssue]:
    for i, rule in rules:
        route = rule.get("route")
        targets = route.get("backends") if isinstance(route, Mapping) else None
        if not isinstance(targets, list):
            continue
        for j, target in enumerate(targets):
            if isinstance(target, str) and target not in backend_names:
                yield ConfigIssue(
                    f"rules[{i}].route.backends[{j}]",
                    f"{target!r} is not a declared backend (backends: {_known(backend_names)})",
                )


_MEMBER_BLOCK_REQUIRED = {"process", "http", "kubernetes"}


def _driver_blocks(
    index: int, pool: Mapping[str, Any], members: list[tuple[int, Mapping[str, Any]]]
) -> Iterator[ConfigIssue]:
    driver = pool.get("driver")
    kind = driver.get("kind", "sim") if isinstance(driver, Mapping) else "sim"
    if kind not in _MEMBER_BLOCK_REQUIRED:
        return
    for j, member in members:
        if not isinstance(member.get(kind), Mapping):
            yield ConfigIssue(
                f"pools[{index}].members[{j}].{kind}",
                f"required by driver kind {kind!r} (how to run this member)",
            )
