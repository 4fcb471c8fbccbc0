"""Load and validate a config file, turning every problem into a :class:`ConfigIssue`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hotseat_common.config.checks import cross_check
from hotseat_common.config.errors import ConfigError, ConfigIssue
from hotseat_common.config.model import HotseatConfig


def format_path(loc: Sequence[int | str]) -> str:
    """``('rules', 2, 'route')`` -> ``rules[2].route``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _choices(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected)) or expected


def _allowed_fields(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _issue(error: ErrorDetails) -> ConfigIssue:
    loc = _strip_union_tags(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind in {"enum", "literal_error"}:
        return ConfigIssue(
            format_path(loc), f"{value!r} is not one of {_choices(str(ctx['expected']))}"
        )
    if kind == "union_tag_invalid":
        tag_field = str(ctx.get("discriminator", "kind")).strip("'")
        return ConfigIssue(
            format_path([*loc, tag_field]),
            f"{ctx.get('tag')!r} is not one of {_choices(str(ctx['expected_tags']))}",
        )
    if kind == "union_tag_not_found":
        tag_field = str(ctx.get("discriminator", "kind")).strip("'")
        return ConfigIssue(format_path([*loc, tag_field]), "required field is missing")
    if kind == "missing":
        return ConfigIssue(format_path(loc), "required field is missing")
    if kind == "extra_forbidden":
        return ConfigIssue(format_path(loc), "unknown field")
    message = error["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
        if value is not None and not isinstance(value, Mapping | list):
            message += f" (got {value!r})"
    return ConfigIssue(format_path(loc), message)


_DRIVER_KINDS = frozenset({"sim", "process", "http", "kubernetes"})


def _strip_union_tags(loc: Sequence[int | str]) -> list[int | str]:
    """Drop the tag pydantic inserts after a discriminated union (``driver.sim.x``)."""
    out: list[int | str] = []
    for part in loc:
        if out and out[-1] == "driver" and part in _DRIVER_KINDS:
            continue
        out.append(part)
    return out


def _suggest(issue: ConfigIssue, raw: Mapping[str, Any]) -> ConfigIssue:
    """Add "did you mean" to an unknown field when a known one is close."""
    if issue.message != "unknown field":
        return issue
    field = issue.path.rsplit(".", 1)[-1]
    parent_model = _model_at(issue.path.rsplit(".", 1)[0] if "." in issue.path else "", raw)
    if parent_model is None:
        return issue
    allowed = _allowed_fields(parent_model)
    close = difflib.get_close_matches(field, allowed, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
    return ConfigIssue(issue.path, f"unknown field ({hint})")


def _model_at(path: str, raw: Mapping[str, Any]) -> type[BaseModel] | None:
    """The model class that validates the object at ``path``."""
    model: type[BaseModel] = HotseatConfig
    node: Any = raw
    for part in filter(None, path.split(".")):
        name, *indexes = re.split(r"\[(\d+)\]", part)
        field = next(
            (f for fname, f in model.model_fields.items() if (f.alias or fname) == name), None
        )
        if field is None:
            return None
        node = node.get(name) if isinstance(node, Mapping) else None
        for index in filter(None, indexes):
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        candidate = _model_in(field.annotation, node)
        if candidate is None:
            return None
        model = candidate
    return model


def _model_in(annotation: Any, node: Any) -> type[BaseModel] | None:
    """The model in ``annotation`` that validates ``node`` (union variants picked by kind)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    metadata_origin = getattr(annotation, "__origin__", None)
    if getattr(annotation, "__metadata__", None) is not None and metadata_origin is not None:
        return _model_in(metadata_origin, node)
    kind = node.get("kind") if isinstance(node, Mapping) else None
    candidates = [
        found
        for arg in getattr(annotation, "__args__", ()) or ()
        if (found := _model_in(arg, node)) is not None
    ]
    for candidate in candidates:
        kind_field = candidate.model_fields.get("kind")
        if kind_field is None or kind in (getattr(kind_field.annotation, "__args__", ()) or ()):
            return candidate
    return None


def _is_echo(error: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """A "too short" list error that only repeats an invalid item's own error."""
    if error["type"] != "too_short":
        return False
    loc = tuple(error["loc"])
    return any(tuple(e["loc"][: len(loc)]) == loc and len(e["loc"]) > len(loc) for e in errors)


def parse_config(raw: object, source: str = "<config>") -> HotseatConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` with every issue."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            source, [ConfigIssue("", f"the top level must be a mapping, not {type(raw).__name__}")]
        )
    issues: list[ConfigIssue] = []
    config: HotseatConfig | None = None
    try:
        config = HotseatConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        issues += [_suggest(_issue(e), raw) for e in errors if not _is_echo(e, errors)]
    issues += cross_check(raw)
    if issues or config is None:
        raise ConfigError(source, issues)
    return config


def load_config(path: str | Path) -> HotseatConfig:
    """Read and validate the YAML file at ``path``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [ConfigIssue("", f"cannot read file: {exc.strerror}")]) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [ConfigIssue("", f"invalid YAML: {where}{problem}")]) from exc
    return parse_config(raw, source)
