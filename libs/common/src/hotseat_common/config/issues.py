"""Turn pydantic validation errors into :class:`ConfigIssue` lines a person can act on.

Each line names the path in the file (``rules[2].route.poolActivation``), the offending
value as it was written (YAML spelling: ``null``, ``true``) and what is allowed instead.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from hotseat_common.config.errors import ConfigIssue
from hotseat_common.config.model import HotseatConfig

Loc = Sequence[int | str]

_MISSING = object()
_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit"


def format_path(loc: Loc) -> str:
    """``('rules', 2, 'route')`` -> ``rules[2].route``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def show(value: object) -> str:
    """``value`` as a YAML user would recognise it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "an empty list" if not value else "a list"
    return repr(value)


def describe_all(errors: list[ErrorDetails], raw: Mapping[str, Any]) -> list[ConfigIssue]:
    """Every pydantic error of one validation as issues, without echoes or repeats.

    A plain union (``bool | int | str``) fails once per alternative; those collapse into
    one issue at the field that lists what it accepts.
    """
    issues: list[ConfigIssue] = []
    for error in errors:
        if _is_echo(error, errors):
            continue
        loc = _strip_union_tags(error["loc"])
        branch = _union_branch_at(loc)
        if branch is None:
            issues.append(describe(error, raw))
            continue
        field_loc = loc[:branch]
        value = _lookup(raw, field_loc)
        accepted = _accepted(_annotation_at(field_loc))
        issues.append(ConfigIssue(format_path(field_loc), f"must be {accepted} ({_got(value)})"))
    return list(dict.fromkeys(issues))


def _is_echo(error: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """A "too short" list error that only repeats an invalid item's own error."""
    if error["type"] != "too_short":
        return False
    loc = tuple(error["loc"])
    return any(tuple(e["loc"][: len(loc)]) == loc and len(e["loc"]) > len(loc) for e in errors)


def describe(error: ErrorDetails, raw: Mapping[str, Any]) -> ConfigIssue:
    """One pydantic error as a config issue; ``raw`` is the mapping that was validated."""
    loc = _strip_union_tags(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    found = _lookup(raw, loc)
    value = error.get("input") if found is _MISSING else found
    if kind == "invalid_key":
        return ConfigIssue(
            format_path(loc[:-1]), f"field name {show(value)} is not text (quote it)"
        )
    if kind in {"union_tag_invalid", "union_tag_not_found"}:
        field = str(ctx.get("discriminator", "kind")).strip("'\"")
        choices = _choices(str(ctx.get("expected_tags", ""))) or _union_tags(loc)
        if kind == "union_tag_not_found":
            return ConfigIssue(
                format_path([*loc, field]), f"required field is missing (one of {choices})"
            )
        return ConfigIssue(
            format_path([*loc, field]), f"{show(ctx.get('tag'))} is not one of {choices}"
        )
    if kind == "extra_forbidden":
        return ConfigIssue(format_path(loc), _unknown_field(loc, raw))
    return ConfigIssue(format_path(loc), _message(kind, ctx, value, error["msg"]))


def _message(kind: str, ctx: Mapping[str, Any], value: object, msg: str) -> str:
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple(ctx, value)
    if kind == "value_error":
        text = msg.removeprefix("Value error, ")
        # A validator that wrote the Python spelling of null/true/false: say it in YAML.
        if isinstance(value, bool) or value is None:
            text = text.replace(repr(value), show(value), 1)
        return text
    text = re.sub(r"^Input should be ", "must be ", msg)
    return f"{text} (got {show(value)})"


def _num(bound: object) -> str:
    if isinstance(bound, float) and bound.is_integer():
        return str(int(bound))
    return str(bound)


def _got(value: object) -> str:
    return f"got {show(value)}"


def _must_be_text(_ctx: Mapping[str, Any], value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"must be text ({_got(value)}; write it in quotes: '{value}')"
    return f"must be text ({_got(value)})"


def _pattern(ctx: Mapping[str, Any], value: object) -> str:
    if str(ctx.get("pattern", "")).startswith("^[A-Za-z0-9]"):
        return f"{show(value)} is not a valid name (use {_NAME_RULE})"
    return f"{show(value)} does not match {ctx.get('pattern')}"


def _too_short(ctx: Mapping[str, Any], value: object) -> str:
    least = ctx.get("min_length", 1)
    items = "item" if least == 1 else "items"
    return f"must list at least {least} {items} ({_got(value)})"


def _too_long(ctx: Mapping[str, Any], value: object) -> str:
    return f"must list at most {ctx.get('max_length')} items ({_got(value)})"


def _string_too_short(ctx: Mapping[str, Any], _value: object) -> str:
    least = ctx.get("min_length", 1)
    return "must not be empty" if least == 1 else f"must be at least {least} characters long"


def _string_too_long(ctx: Mapping[str, Any], value: object) -> str:
    size = len(value) if isinstance(value, str) else "more"
    return f"must be at most {ctx.get('max_length')} characters long (got {size})"


def _enum(ctx: Mapping[str, Any], value: object) -> str:
    return f"{show(value)} is not one of {_choices(str(ctx.get('expected', '')))}"


_SIMPLE: dict[str, Callable[[Mapping[str, Any], object], str]] = {
    "missing": lambda _c, _v: "required field is missing",
    "enum": _enum,
    "literal_error": _enum,
    "model_type": lambda _c, v: f"must be a mapping ({_got(v)})",
    "model_attributes_type": lambda _c, v: f"must be a mapping ({_got(v)})",
    "dict_type": lambda _c, v: f"must be a mapping ({_got(v)})",
    "tuple_type": lambda _c, v: f"must be a list ({_got(v)})",
    "list_type": lambda _c, v: f"must be a list ({_got(v)})",
    "string_type": _must_be_text,
    "int_type": lambda _c, v: f"must be a whole number ({_got(v)})",
    "int_parsing": lambda _c, v: f"must be a whole number ({_got(v)})",
    "int_from_float": lambda _c, v: f"must be a whole number ({_got(v)})",
    "float_type": lambda _c, v: f"must be a number ({_got(v)})",
    "float_parsing": lambda _c, v: f"must be a number ({_got(v)})",
    "bool_type": lambda _c, v: f"must be true or false ({_got(v)})",
    "bool_parsing": lambda _c, v: f"must be true or false ({_got(v)})",
    "greater_than": lambda c, v: f"must be greater than {_num(c.get('gt'))} ({_got(v)})",
    "greater_than_equal": lambda c, v: f"must be at least {_num(c.get('ge'))} ({_got(v)})",
    "less_than": lambda c, v: f"must be less than {_num(c.get('lt'))} ({_got(v)})",
    "less_than_equal": lambda c, v: f"must be at most {_num(c.get('le'))} ({_got(v)})",
    "too_short": _too_short,
    "too_long": _too_long,
    "string_too_short": _string_too_short,
    "string_too_long": _string_too_long,
    "string_pattern_mismatch": _pattern,
}


def _choices(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected)) or expected


def _lookup(raw: Mapping[str, Any], loc: Loc) -> object:
    node: object = raw
    for part in loc:
        in_mapping = isinstance(part, str) and isinstance(node, Mapping) and part in node
        in_list = isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node)
        if not (in_mapping or in_list):
            return _MISSING
        node = node[part]  # type: ignore[index]
    return node


# --- where a path leads in the schema -------------------------------------------------


def _strip_union_tags(loc: Loc) -> list[int | str]:
    """Drop the variant tag pydantic inserts after a discriminated union (``driver.sim.x``)."""
    out: list[int | str] = []
    for part in loc:
        if out and isinstance(part, str) and _is_tag_of(out, part):
            continue
        out.append(part)
    return out


def _is_tag_of(loc: Loc, part: str) -> bool:
    """True when ``part`` is a variant tag of the union field at ``loc``."""
    annotation = _annotation_at(loc)
    return annotation is not None and part in _tags(annotation)


def _annotation_at(loc: Loc) -> Any:
    """The annotation of the field that ``loc`` (string keys and list indexes) leads to."""
    annotation: Any = HotseatConfig
    for part in loc:
        if isinstance(part, int):
            annotation = _element(annotation)
            continue
        models = _models_in(annotation)
        fields = [f for m in models if (f := _field(m, part)) is not None]
        if not fields:
            return None
        annotation = fields[0].annotation
    return annotation


def _union_branch_at(loc: Loc) -> int | None:
    """Index of the part of ``loc`` that names an alternative of a plain union, if any."""
    annotation: Any = HotseatConfig
    for index, part in enumerate(loc):
        if isinstance(part, int):
            annotation = _element(annotation)
            continue
        fields = [f for m in _models_in(annotation) if (f := _field(m, part)) is not None]
        if fields:
            annotation = fields[0].annotation
            continue
        return index if _names_alternative(annotation, part) else None
    return None


def _names_alternative(annotation: Any, part: str) -> bool:
    """True when ``part`` is pydantic's tag for one alternative of a plain union.

    Tags are type names, sometimes wrapped (``str``, ``function-after[http_url(), str]``).
    """
    alternatives = [a for a in _alternatives(annotation) if a is not type(None)]
    if len(alternatives) < 2:  # X | None is validated without tags
        return False
    names = [getattr(get_origin(a) or a, "__name__", "") for a in alternatives]
    return any(name and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", part) for name in names)


def _alternatives(annotation: Any) -> list[Any]:
    annotation = _strip(annotation)
    if get_origin(annotation) not in {Union, types.UnionType}:
        return [annotation]
    return [a for arg in get_args(annotation) for a in _alternatives(arg)]


def _accepted(annotation: Any) -> str:
    """What a union field accepts, in words: ``true or false, a number, text or null``."""
    words: list[str] = []
    for alternative in _alternatives(annotation):
        word = _WORDS.get(alternative) or _WORDS.get(get_origin(alternative))
        if word is None and isinstance(alternative, type) and issubclass(alternative, BaseModel):
            word = "a mapping"
        if word is not None and word not in words:
            words.append(word)
    if len(words) < 2:
        return words[0] if words else "something else"
    return ", ".join(words[:-1]) + f" or {words[-1]}"


_WORDS: dict[Any, str] = {
    bool: "true or false",
    int: "a number",
    float: "a number",
    str: "text",
    type(None): "null",
    tuple: "a list",
    list: "a list",
    dict: "a mapping",
}


def _field(model: type[BaseModel], name: str) -> Any:
    for field_name, field in model.model_fields.items():
        if name in {field.alias, field_name}:
            return field
    return None


def _strip(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _element(annotation: Any) -> Any:
    annotation = _strip(annotation)
    if get_origin(annotation) in {Union, types.UnionType}:
        for arg in get_args(annotation):
            if (element := _element(arg)) is not None:
                return element
        return None
    if get_origin(annotation) in {tuple, list}:
        return get_args(annotation)[0]
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in {Union, types.UnionType}:
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def _tags(annotation: Any) -> list[str]:
    tags: list[str] = []
    for model in _models_in(annotation):
        kind = model.model_fields.get("kind")
        if kind is not None and get_origin(kind.annotation) is Literal:
            tags += [str(t) for t in get_args(kind.annotation)]
    return tags


def _union_tags(loc: Loc) -> str:
    return ", ".join(_tags(_annotation_at(loc)))


def model_at(loc: Loc, raw: Mapping[str, Any]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc`` (a union picked by ``kind``)."""
    models = _models_in(_annotation_at(loc)) if loc else [HotseatConfig]
    node = _lookup(raw, loc)
    kind = node.get("kind") if isinstance(node, Mapping) else None
    for model in models:
        if kind is None or kind in _tags(model):
            return model
    return None


# --- unknown fields ---------------------------------------------------------------------


def _aliases(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _unknown_field(loc: Loc, raw: Mapping[str, Any]) -> str:
    """ "unknown field" with the closest allowed name, or the list of allowed names."""
    field = str(loc[-1])
    model = model_at(loc[:-1], raw)
    if model is None:
        return "unknown field"
    allowed = _aliases(model)
    parent = _lookup(raw, loc[:-1])
    camel = to_camel(field)
    if camel != field and camel in allowed and isinstance(parent, Mapping) and camel in parent:
        return f"unknown field (the same as {camel!r}, which is also set; keep {camel!r})"
    folded = {name.lower(): name for name in allowed}
    close = folded.get(camel.lower()) or next(
        iter(difflib.get_close_matches(field, allowed, n=1, cutoff=0.7)), None
    )
    if close is None:
        close = next(_nested_home(model, field), None)
    if close is not None:
        return f"unknown field (did you mean {close!r}?)"
    return f"unknown field (allowed: {', '.join(allowed)})"


def _nested_home(model: type[BaseModel], field: str) -> Iterator[str]:
    """``route.poolActivation`` when ``poolActivation`` was written one level too high."""
    for name, info in model.model_fields.items():
        for child in _models_in(info.annotation):
            if field.lower() in {a.lower() for a in _aliases(child)}:
                exact = next(a for a in _aliases(child) if a.lower() == field.lower())
                yield f"{info.alias or name}.{exact}"
