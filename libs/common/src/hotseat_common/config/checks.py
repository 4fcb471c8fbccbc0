"""Cross-reference checks that no single field can make: names that must exist or be unique.

They read the raw mapping (not the validated model) so that they still run, and still
report, when some fields of the same file are invalid: a user sees every error at once.

A reference is only checked against a list whose names are all known. When an entry has
no valid name (missing, not text, not a valid name) or the list itself is malformed, that problem is
already reported where it is, and a reference to the list could be to that very entry, so
"not declared" would be an echo of the first error rather than a second one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from pydantic import TypeAdapter, ValidationError

from hotseat_common.config.errors import ConfigIssue
from hotseat_common.config.model import Name
from hotseat_common.durations import format_duration, parse_duration

_MEMBER_BLOCK_REQUIRED = frozenset({"process", "http", "kubernetes"})
_CACHE_DRIVERS = ("process", "http", "sim")
_SAVE_PATH_FLAG = "--slot-save-path"
_MODEL_FLAGS = ("-m", "--model")
_NAME: TypeAdapter[str] = TypeAdapter(Name)
_CLOSE = 0.7  # similarity above which a name is offered as "did you mean"


@dataclass(frozen=True, slots=True)
class _Section:
    """The entries of one list of named things, and whether every name is known."""

    path: str
    items: list[tuple[int, Mapping[str, Any]]]
    complete: bool

    @property
    def names(self) -> list[str]:
        return [n for _, item in self.items if (n := _name(item)) is not None]


def _section(parent: Mapping[str, Any], key: str, path: str, *, required: bool) -> _Section:
    value = parent.get(key)
    if value is None and key not in parent and not required:
        return _Section(path, [], complete=True)
    if not isinstance(value, list) or not value:
        return _Section(path, [], complete=False)
    items = [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)]
    complete = len(items) == len(value) and all(_name(item) is not None for _, item in items)
    return _Section(path, items, complete)


def _name(item: Mapping[str, Any]) -> str | None:
    """The item's name, or None when it has no valid one (reported by the field check)."""
    name = item.get("name")
    return name if _is_name(name) else None


def _is_name(value: object) -> TypeGuard[str]:
    """True for a valid name; an invalid one is reported by the field check, not here."""
    try:
        _NAME.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def _unique(section: _Section) -> Iterator[ConfigIssue]:
    seen: dict[str, int] = {}
    for i, item in section.items:
        name = _name(item)
        if name is None:
            continue
        if name in seen:
            yield ConfigIssue(
                f"{section.path}[{i}].name",
                f"{name!r} is already used by {section.path}[{seen[name]}]",
            )
        else:
            seen[name] = i


def _unknown(value: str, what: str, names: list[str], plural: str) -> str:
    known = ", ".join(dict.fromkeys(names)) if names else "none declared"
    close = difflib.get_close_matches(value, names, n=1, cutoff=_CLOSE)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{value!r} is not {what}{hint} ({plural}: {known})"


def cross_check(raw: Mapping[str, Any]) -> list[ConfigIssue]:
    """Every cross-reference error in ``raw``, section by section."""
    backends = _section(raw, "backends", "backends", required=False)
    pools = _section(raw, "pools", "pools", required=False)
    rules = _section(raw, "rules", "rules", required=False)
    groups = _section(raw, "modelGroups", "modelGroups", required=False)
    issues: list[ConfigIssue] = []
    issues += _unique(backends)
    issues += _unique(groups)
    issues += _unique(pools)
    issues += _unique(rules)
    pool_members: dict[str, _Section] = {}
    cache_dirs: dict[str, str] = {}
    for i, pool in pools.items:
        members = _section(pool, "members", f"pools[{i}].members", required=True)
        if (pool_name := _name(pool)) is not None:
            pool_members.setdefault(pool_name, members)
        issues += _unique(members)
        issues += _check_default(i, pool, members)
        issues += _check_schedule(i, pool, members)
        issues += _check_capacity(i, pool, members)
        issues += _driver_blocks(pool, members)
        issues += _cache_blocks(pool, members, cache_dirs)
    issues += _check_backend_pools(backends, pools, pool_members)
    issues += _check_groups(groups, backends)
    issues += _check_rules(rules, backends, groups)
    default_route = raw.get("defaultRoute")
    if _is_name(default_route) and backends.complete and default_route not in backends.names:
        issues.append(
            ConfigIssue(
                "defaultRoute",
                _unknown(default_route, "a declared backend", backends.names, "backends"),
            )
        )
    if raw.get("unknownModels") == "DefaultRoute" and default_route is None:
        issues.append(
            ConfigIssue(
                "unknownModels",
                "'DefaultRoute' needs defaultRoute, which is unset (set it, or use Refuse)",
            )
        )
    return issues


def _check_default(index: int, pool: Mapping[str, Any], members: _Section) -> Iterator[ConfigIssue]:
    default = pool.get("default")
    if _is_name(default) and members.complete and default not in members.names:
        yield ConfigIssue(
            f"pools[{index}].default",
            _unknown(default, "a member of this pool", members.names, "members"),
        )


DEFAULT_SWAP_BUDGET_S = 300.0


def _seconds(value: object) -> float | None:
    """A duration's seconds; None when it is missing or invalid (reported by its field)."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError:
        return None


def _check_schedule(
    index: int, pool: Mapping[str, Any], members: _Section
) -> Iterator[ConfigIssue]:
    """Scheduler knobs that cannot work together (docs/adr/0006)."""
    path = f"pools[{index}]"
    max_wait = _seconds(pool.get("maxWait"))
    budget = _seconds(pool.get("swapBudget", DEFAULT_SWAP_BUDGET_S))
    if max_wait is not None and budget is not None and max_wait >= budget:
        yield ConfigIssue(
            f"{path}.maxWait",
            f"{format_duration(max_wait)} is not shorter than swapBudget"
            f" ({format_duration(budget)}): a request is answered 503 once it has been held"
            " swapBudget, before the resident would close for it",
        )
    default = pool.get("default")
    for j, member in members.items:
        if _is_name(default) and _name(member) == default and member.get("idleUnloadAfter"):
            yield ConfigIssue(
                f"{members.path}[{j}].idleUnloadAfter",
                f"{default!r} is the pool's default, the member an idle pool returns to: it"
                " is never unloaded for being idle (remove the setting, or the default)",
            )


def _gib(value: object) -> float | None:
    """A positive number of GiB; None when missing or invalid (reported by its field)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def _capacity_gib(capacity: Mapping[str, Any]) -> float | None:
    """The pool's capacity in GiB; None when it cannot be told (its fields report why)."""
    if "gpuMemoryGiB" in capacity:
        return _gib(capacity["gpuMemoryGiB"])
    devices = capacity.get("devices")
    if not isinstance(devices, list) or not devices:
        return None
    sizes = [_gib(d.get("memoryGiB")) if isinstance(d, Mapping) else None for d in devices]
    return None if None in sizes else sum(s for s in sizes if s is not None)


def _check_capacity(  # noqa: C901 - one refusal per case, each with its own path
    index: int, pool: Mapping[str, Any], members: _Section
) -> Iterator[ConfigIssue]:
    """A capacity pool (docs/adr/0008): its memory given once, every member sized and no
    larger than the pool, the default and pinned members fitting together; ``memoryGiB``
    and ``pinned`` mean nothing in a one-resident pool."""
    path = f"pools[{index}]"
    capacity = pool.get("capacity")
    if not isinstance(capacity, Mapping):
        for j, member in members.items:
            for key in ("memoryGiB", "pinned", "preload"):
                if member.get(key) not in (None, False):
                    yield ConfigIssue(
                        f"{members.path}[{j}].{key}",
                        f"{key} needs the pool's capacity (capacity: {{gpuMemoryGiB: N}});"
                        " without it the pool holds one member at a time",
                    )
        return
    if ("gpuMemoryGiB" in capacity) == ("devices" in capacity):
        both = "devices" in capacity
        yield ConfigIssue(
            f"{path}.capacity",
            "give either gpuMemoryGiB or devices (a list of {name, memoryGiB}), not both"
            if both
            else "give gpuMemoryGiB or devices (a list of {name, memoryGiB})",
        )
        return
    total = _capacity_gib(capacity)
    if total is None:
        return
    default = pool.get("default")
    together: list[tuple[str, float]] = []
    for j, member in members.items:
        if "memoryGiB" not in member:
            yield ConfigIssue(
                f"{members.path}[{j}].memoryGiB",
                "required in a pool with capacity: the GPU memory the member holds while"
                " loaded, in GiB",
            )
            continue
        size = _gib(member.get("memoryGiB"))
        if size is None:
            continue
        if size > total:
            yield ConfigIssue(
                f"{members.path}[{j}].memoryGiB",
                f"{size:g} GiB is more than the pool's capacity ({total:g} GiB): it could"
                " never be loaded",
            )
            continue
        name = _name(member)
        if name is not None and (member.get("pinned") is True or name == default):
            together.append((name, size))
    need = sum(size for _, size in together)
    if len(together) > 1 and need > total:
        names = ", ".join(name for name, _ in together)
        yield ConfigIssue(
            f"{path}.capacity",
            f"the default and pinned members ({names}) need {need:g} GiB together, more than"
            f" the pool's {total:g} GiB: they are all kept resident",
        )
    yield from _check_preload(members, default, total, need)


def _check_preload(
    members: _Section, default: object, total: float, kept: float
) -> Iterator[ConfigIssue]:
    """``preload`` members are loaded at start beside the kept ones (default, pinned): a
    kept member is loaded already, and a preload set that cannot fit beside them is
    refused at the first member that overflows."""
    need = kept
    for j, member in members.items:
        if member.get("preload") is not True:
            continue
        if member.get("pinned") is True or _name(member) == default:
            yield ConfigIssue(
                f"{members.path}[{j}].preload",
                "the default and pinned members are loaded at start and kept already",
            )
            continue
        size = _gib(member.get("memoryGiB"))
        if size is None or size > total:
            continue  # refused above
        need += size
        if need > total + 1e-9:
            yield ConfigIssue(
                f"{members.path}[{j}].preload",
                f"the default, pinned and preload members up to this one need {need:g} GiB"
                f" together, more than the pool's {total:g} GiB: it could not be preloaded",
            )


def _check_backend_pools(
    backends: _Section, pools: _Section, pool_members: dict[str, _Section]
) -> Iterator[ConfigIssue]:
    fronted: dict[tuple[str, str], int] = {}
    for i, backend in backends.items:
        ref = backend.get("pool")
        if not isinstance(ref, Mapping):
            continue
        pool_name, member = ref.get("name"), ref.get("member")
        if not _is_name(pool_name) or not _is_name(member):
            continue
        members = pool_members.get(pool_name)
        if members is None:
            if pools.complete:
                yield ConfigIssue(
                    f"backends[{i}].pool.name",
                    _unknown(pool_name, "a declared pool", pools.names, "pools"),
                )
        elif members.complete and member not in members.names:
            yield ConfigIssue(
                f"backends[{i}].pool.member",
                _unknown(member, f"a member of pool {pool_name!r}", members.names, "members"),
            )
        elif (pool_name, member) in fronted:
            first = fronted[(pool_name, member)]
            yield ConfigIssue(
                f"backends[{i}].pool",
                f"member {member!r} of pool {pool_name!r} is already fronted by "
                f"backends[{first}] (a pool member has at most one backend)",
            )
        else:
            fronted[(pool_name, member)] = i


def _check_groups(groups: _Section, backends: _Section) -> Iterator[ConfigIssue]:
    """Each group: a name no backend has, members that are pooled backends, one per
    pool, and no more copies than members."""
    for i, group in groups.items:
        name = _name(group)
        if name is not None and name in backends.names:
            first = next(j for j, item in backends.items if _name(item) == name)
            yield ConfigIssue(
                f"modelGroups[{i}].name",
                f"{name!r} is already a backend's name (backends[{first}]): a rule entry "
                "names one or the other",
            )
        members = group.get("members")
        if not isinstance(members, list):
            continue
        on_pool: dict[str, int] = {}
        for j, member in enumerate(members):
            if not isinstance(member, Mapping):
                continue
            path = f"modelGroups[{i}].members[{j}]"
            yield from _check_group_member(path, j, member, backends, on_pool)
        copies = group.get("maxCopies")
        if isinstance(copies, int) and not isinstance(copies, bool) and copies > len(members):
            yield ConfigIssue(
                f"modelGroups[{i}].maxCopies",
                f"{copies} is more than the group's {len(members)} members (one copy per pool)",
            )


def _check_group_member(
    path: str, index: int, member: Mapping[str, Any], backends: _Section, on_pool: dict[str, int]
) -> Iterator[ConfigIssue]:
    """One member: a declared backend with a pool no earlier member is on."""
    target = member.get("backend")
    if not _is_name(target):
        return
    backend = next((item for _, item in backends.items if _name(item) == target), None)
    if backend is None:
        if backends.complete:
            yield ConfigIssue(
                f"{path}.backend",
                _unknown(target, "a declared backend", backends.names, "backends"),
            )
        return
    ref = backend.get("pool")
    if not isinstance(ref, Mapping):
        yield ConfigIssue(
            f"{path}.backend",
            f"{target!r} has no pool: a group's members are pooled backends",
        )
        return
    pool = ref.get("name")
    if not _is_name(pool):
        return
    if pool in on_pool:
        prefix = path.rsplit("[", 1)[0]
        yield ConfigIssue(
            f"{path}.backend",
            f"{target!r} is on pool {pool!r}, as {prefix}[{on_pool[pool]}] is (one member "
            "per pool)",
        )
    else:
        on_pool[pool] = index


def _check_rules(rules: _Section, backends: _Section, groups: _Section) -> Iterator[ConfigIssue]:
    for i, rule in rules.items:
        route = rule.get("route")
        targets = route.get("backends") if isinstance(route, Mapping) else None
        if not isinstance(targets, list):
            continue
        listed: dict[str, int] = {}
        for j, target in enumerate(targets):
            if not _is_name(target):
                continue
            path = f"rules[{i}].route.backends"
            if target in listed:
                yield ConfigIssue(
                    f"{path}[{j}]", f"{target!r} is already listed at {path}[{listed[target]}]"
                )
                continue
            listed[target] = j
            if target in groups.names:
                continue
            if backends.complete and groups.complete and target not in backends.names:
                what = "a declared backend or model group" if groups.items else "a declared backend"
                names = backends.names + groups.names
                plural = "backends and groups" if groups.items else "backends"
                yield ConfigIssue(f"{path}[{j}]", _unknown(target, what, names, plural))


def _driver_blocks(pool: Mapping[str, Any], members: _Section) -> Iterator[ConfigIssue]:
    driver = pool.get("driver")
    kind = driver.get("kind", "sim") if isinstance(driver, Mapping) else "sim"
    if kind not in _MEMBER_BLOCK_REQUIRED:
        return
    for j, member in members.items:
        if member.get(kind) is None:
            yield ConfigIssue(
                f"{members.path}[{j}].{kind}",
                f"required field is missing (driver kind {kind!r} needs it to run this member)",
            )


def _cache_blocks(
    pool: Mapping[str, Any], members: _Section, dirs: dict[str, str]
) -> Iterator[ConfigIssue]:
    """A member that carries its prompt cache over swaps: a driver that can, what that
    driver needs to know, and a directory of its own."""
    driver = pool.get("driver")
    kind = driver.get("kind", "sim") if isinstance(driver, Mapping) else "sim"
    for j, member in members.items:
        cache = member.get("cache")
        if not isinstance(cache, Mapping):
            continue
        path = f"{members.path}[{j}].cache"
        yield from _own_dir(cache.get("dir"), f"{members.path}[{j}]", dirs)
        if cache.get("carryOver") is not True:
            continue
        if kind not in _CACHE_DRIVERS:
            yield ConfigIssue(
                f"{path}.carryOver",
                f"prompt-cache carry-over needs driver kind process, http or sim "
                f"(this pool's is {kind!r})",
            )
        elif kind == "http":
            for key in ("dir", "modelFile"):
                if cache.get(key) is None:
                    yield ConfigIssue(f"{path}.{key}", _HTTP_CACHE_NEEDS[key])
        elif kind == "process":
            yield from _process_cache(member, path, cache)


def _own_dir(directory: object, member: str, dirs: dict[str, str]) -> Iterator[ConfigIssue]:
    if not isinstance(directory, str) or not directory:
        return
    if directory in dirs:
        yield ConfigIssue(
            f"{member}.cache.dir",
            f"{directory!r} is already the cache directory of {dirs[directory]} "
            "(each member saves into a directory of its own)",
        )
    else:
        dirs[directory] = member


_HTTP_CACHE_NEEDS = {
    "dir": "required with carryOver on an http member: the directory its server's "
    "--slot-save-path names, as this controller sees it",
    "modelFile": "required with carryOver on an http member: the model file its server "
    "runs (its identity keys the saved slots)",
}


def _process_cache(
    member: Mapping[str, Any], path: str, cache: Mapping[str, Any]
) -> Iterator[ConfigIssue]:
    process = member.get("process")
    command = process.get("command") if isinstance(process, Mapping) else None
    if not isinstance(command, list):
        return
    names_model = False
    for k, arg in enumerate(command):
        if not isinstance(arg, str):
            continue
        if arg == _SAVE_PATH_FLAG or arg.startswith(_SAVE_PATH_FLAG + "="):
            yield ConfigIssue(
                f"{path.removesuffix('.cache')}.process.command[{k}]",
                f"remove {_SAVE_PATH_FLAG}: with cache.carryOver the driver passes "
                f"{_SAVE_PATH_FLAG} with the member's cache directory (cache.dir)",
            )
        names_model = names_model or arg in _MODEL_FLAGS or arg.startswith("--model=")
    if not names_model and cache.get("modelFile") is None:
        yield ConfigIssue(
            f"{path}.modelFile",
            "required: the command names no model file with -m or --model, and the "
            "file's identity keys the saved slots",
        )
