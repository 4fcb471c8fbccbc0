"""Load and validate a config file, turning every problem into a :class:`ConfigIssue`.

All problems of a file are collected before anything is raised: YAML keys written twice,
every field error (translated by :mod:`hotseat_common.config.issues`) and every
cross-reference error (:mod:`hotseat_common.config.checks`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from hotseat_common.config.checks import cross_check
from hotseat_common.config.errors import ConfigError, ConfigIssue
from hotseat_common.config.issues import describe_all, format_path, show
from hotseat_common.config.model import HotseatConfig

__all__ = ["format_path", "load_config", "parse_config"]

_SECTIONS = ", ".join(f.alias or n for n, f in HotseatConfig.model_fields.items())


def parse_config(
    raw: object, source: str = "<config>", issues: list[ConfigIssue] | None = None
) -> HotseatConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` with every issue.

    ``issues`` are problems already found while reading the file; they are reported first.
    """
    issues = list(issues or [])
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        issues.append(
            ConfigIssue(
                "",
                f"the top level must be a mapping of sections ({_SECTIONS}), not {show(raw)}",
            )
        )
        raise ConfigError(source, issues)
    config: HotseatConfig | None = None
    try:
        config = HotseatConfig.model_validate(raw)
    except ValidationError as exc:
        issues += describe_all(exc.errors(include_url=False), raw)
    issues += cross_check(raw)
    if issues or config is None:
        raise ConfigError(source, list(dict.fromkeys(issues)))
    return config


def load_config(path: str | Path) -> HotseatConfig:
    """Read and validate the YAML file at ``path``."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, [ConfigIssue("", f"cannot read file: {exc.strerror}")]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reason = f"not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})"
        raise ConfigError(source, [ConfigIssue("", reason)]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [ConfigIssue("", _yaml_problem(exc))]) from exc
    if node is None:
        raise ConfigError(
            source, [ConfigIssue("", f"the file is empty (expected the sections {_SECTIONS})")]
        )
    return parse_config(raw, source, list(_duplicate_keys(node, [], set())))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and problem.startswith("but "):
        problem = f"{context}, {problem}"
    elif context and context_mark is not None:
        problem = f"{problem} ({context} from line {context_mark.line + 1})"
    return f"invalid YAML: {where}{problem}"


def _duplicate_keys(node: yaml.Node, loc: list[int | str], seen: set[int]) -> Iterator[ConfigIssue]:
    """Keys written twice in one mapping: YAML would silently keep only the last value."""
    if id(node) in seen:  # an alias to a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.value == "<<":
                continue
            line = key.start_mark.line + 1
            if key.value in lines:
                yield ConfigIssue(
                    format_path([*loc, key.value]),
                    f"written twice (lines {lines[key.value]} and {line}); keep one",
                )
            else:
                lines[key.value] = line
            yield from _duplicate_keys(value, [*loc, key.value], seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, [*loc, i], seen)
