"""Write the field reference of docs/configuration.md from the config models.

Usage: ``python scripts/gen_config_docs.py`` rewrites the reference between the markers
in docs/configuration.md; ``--check`` only reports (exit 1) when it is out of date.
Every field needs a description: the docstring written under it in config/model.py.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, BaseModel, BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hotseat_common.config.model import HotseatConfig, http_url
from hotseat_common.durations import format_duration, parse_duration
from hotseat_common.sizes import parse_size

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: field reference (scripts/gen_config_docs.py) -->"
END = "<!-- END GENERATED: field reference -->"


class UndocumentedFieldError(Exception):
    """A config field has no description to put in the reference."""


@dataclass(frozen=True)
class Section:
    """One table of the reference: the fields of one model at one place in the file."""

    path: str
    model: type[BaseModel]
    variant: str | None = None

    @property
    def anchor(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", f"{self.path} {self.variant or ''}".lower())
        return "config-" + (slug.strip("-") or "top-level")

    @property
    def title(self) -> str:
        title = f"`{self.path}`" if self.path else "Top level"
        return f"{title} with `kind: {self.variant}`" if self.variant else title


def sections(model: type[BaseModel] = HotseatConfig, path: str = "") -> Iterator[Section]:
    """Every model reachable from ``model``, depth first in field order."""
    yield Section(path, model, _kind_of(model))
    for name, field in model.model_fields.items():
        key = field.alias or name
        child_path = f"{path}.{key}" if path else key
        annotation = _strip(field.annotation)
        if get_origin(annotation) in {tuple, list}:
            child_path += "[]"
            annotation = _strip(get_args(annotation)[0])
        for child in _models(annotation):
            yield from sections(child, child_path)


def _kind_of(model: type[BaseModel]) -> str | None:
    kind = model.model_fields.get("kind")
    if kind is not None and get_origin(kind.annotation) is Literal:
        return str(get_args(kind.annotation)[0])
    return None


def _strip(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _models(annotation: Any) -> list[type[BaseModel]]:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in {Union, types.UnionType}:
        return [m for arg in get_args(annotation) for m in _models(arg)]
    return []


def _metadata(annotation: Any, metadata: Sequence[Any] = ()) -> list[Any]:
    """The constraints and validators on ``annotation``, nested Annotated included."""
    found: list[Any] = []
    pending = list(metadata)
    if get_origin(annotation) is Annotated:
        pending += list(get_args(annotation)[1:])
    for item in pending:
        if isinstance(item, FieldInfo):
            found += item.metadata
        else:
            found.append(item)
    return found


def type_text(annotation: Any, metadata: Sequence[Any], anchors: dict[type, str]) -> str:
    """The type of a field in words, with its constraints."""
    meta = _metadata(annotation, metadata)
    base = _strip(annotation)
    if get_origin(base) in {Union, types.UnionType}:
        alternatives = [a for a in get_args(base) if a is not type(None)]
        models = _models(base)
        if len(alternatives) > 1 and len(models) == len(alternatives):
            kinds = ", ".join(f"[{_kind_of(m)}](#{anchors[m]})" for m in models)
            return f"mapping chosen by `kind`: {kinds}"
        if len(alternatives) == 1:
            return type_text(alternatives[0], meta, anchors)
        kinds_of_value = list(dict.fromkeys(type_text(a, (), anchors) for a in alternatives))
        if "integer" in kinds_of_value and "number" in kinds_of_value:
            kinds_of_value.remove("integer")
        if type(None) in get_args(base):
            kinds_of_value.append("null")
        return ", ".join(kinds_of_value[:-1]) + f" or {kinds_of_value[-1]}"
    special = _validated_words(meta)
    if special == _NAME:
        return special
    words = special or _type_words(base, anchors)
    if words == "text" and any(isinstance(m, annotated_types.MinLen) for m in meta):
        return "non-empty text"
    return " ".join([words, *_constraints(meta)])


def _validated_words(meta: list[Any]) -> str | None:
    """Types recognised by their validator or pattern: durations, sizes, URLs, names."""
    validators = {
        getattr(m, "func", None) for m in meta if isinstance(m, BeforeValidator | AfterValidator)
    }
    if parse_duration in validators:
        return "[duration](#writing-values)"
    if parse_size in validators:
        return "[size](#writing-values)"
    if http_url in validators:
        return "http(s) URL"
    if any(getattr(m, "pattern", None) for m in meta):
        return _NAME
    return None


def _type_words(base: Any, anchors: dict[type, str]) -> str:
    if isinstance(base, type) and issubclass(base, Enum):
        return " \\| ".join(f"`{member.value}`" for member in base)
    if get_origin(base) is Literal:
        return " \\| ".join(f"`{value}`" for value in get_args(base))
    if isinstance(base, type) and issubclass(base, BaseModel):
        return f"[mapping](#{anchors[base]})"
    if get_origin(base) in {tuple, list}:
        return f"list of {type_text(get_args(base)[0], (), anchors)}"
    if get_origin(base) is dict:
        value = get_args(base)[1]
        return (
            "mapping" if value is object else f"mapping of text to {type_text(value, (), anchors)}"
        )
    return _SIMPLE.get(base, getattr(base, "__name__", str(base)))


_NAME = "[name](#writing-values)"
_SIMPLE: dict[Any, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "text",
    object: "any",
}


def _constraints(meta: list[Any]) -> list[str]:
    out: list[str] = []
    for item in meta:
        if isinstance(item, annotated_types.Gt):
            out.append(f"> {_number(item.gt)}")
        elif isinstance(item, annotated_types.Ge):
            out.append(f"≥ {_number(item.ge)}")
        elif isinstance(item, annotated_types.Lt):
            out.append(f"< {_number(item.lt)}")
        elif isinstance(item, annotated_types.Le):
            out.append(f"≤ {_number(item.le)}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length:
            items = "item" if item.min_length == 1 else "items"
            out.append(f"(at least {item.min_length} {items})")
    return out


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if value is None or value is PydanticUndefined:
        return "unset"
    meta = _metadata(field.annotation, field.metadata)
    if isinstance(value, float) and any(getattr(m, "func", None) is parse_duration for m in meta):
        return f"`{format_duration(value)}`"
    return f"`{_yaml(value)}`"


def _yaml(value: object) -> str:
    """``value`` in YAML flow style."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    return str(value) or '""'


def _description(section: Section, name: str, field: FieldInfo) -> str:
    if not field.description:
        owner = section.model.__name__
        raise UndocumentedFieldError(
            f"{owner}.{name} has no description: write a docstring under it in config/model.py"
        )
    text = " ".join(field.description.split())
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("|", "\\|")


def render_reference(root: type[BaseModel] = HotseatConfig) -> str:
    """The generated part of docs/configuration.md: one table per section."""
    all_sections = list(sections(root))
    anchors = {s.model: s.anchor for s in all_sections}
    out: list[str] = []
    for section in all_sections:
        out += [f'<a id="{section.anchor}"></a>', "", f"### {section.title}", ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in section.model.model_fields.items():
            key = field.alias or name
            kind = type_text(field.annotation, field.metadata, anchors)
            if section.variant and key == "kind":
                kind = f"`{section.variant}`"
            description = _description(section, name, field)
            out.append(f"| `{key}` | {kind} | {default_text(field)} | {description} |")
        out.append("")
    return "\n".join(out)


def render_doc(current: str) -> str:
    """``current`` with the text between the markers replaced by a fresh reference."""
    start, end = current.find(BEGIN), current.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} lacks the markers {BEGIN!r} ... {END!r}")
    return current[: start + len(BEGIN)] + "\n\n" + render_reference() + "\n" + current[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text(encoding="utf-8")
    fresh = render_doc(current)
    if args.check:
        if fresh != current:
            print(f"{DOC} is out of date: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
