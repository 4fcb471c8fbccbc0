"""JSON Schema validation with one readable line per error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]


def schema_errors(document: Any, schema: Mapping[str, Any]) -> list[str]:
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in sorted(
            validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]
        )
    ]
