"""The audit event as JSON Schema (draft 2020-12), generated from the pydantic model.

The model's own schema says which fields exist and their types; two things it cannot
express are added from the same source: which fields every published event carries
(``exclude_none`` leaves out only the optional ones), and which outcomes belong to which
kind (the model checks that in a validator).
"""

from __future__ import annotations

import json
from typing import Any

from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome

ALWAYS_PRESENT = ["v", "id", "time", "kind", "outcome"]


def event_json_schema() -> dict[str, Any]:
    schema = AuditEvent.model_json_schema(mode="serialization")
    by_kind = {"request": RequestOutcome, "pool": PoolOutcome}
    schema["properties"]["outcome"]["enum"] = [o.value for e in by_kind.values() for o in e]
    for name in ALWAYS_PRESENT:
        schema["properties"][name].pop("default", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Hotseat audit event",
        "description": (
            "One request outcome (kind 'request') or pool transition (kind 'pool'), "
            "published to <prefix>.audit.<kind>.<outcome> with Nats-Msg-Id set to id. "
            "Fields that do not apply are left out."
        ),
        **{k: v for k, v in schema.items() if k not in {"title", "description"}},
        "required": ALWAYS_PRESENT,
        "allOf": [
            {
                "if": {"properties": {"kind": {"const": kind}}},
                "then": {"properties": {"outcome": {"enum": [o.value for o in outcomes]}}},
            }
            for kind, outcomes in by_kind.items()
        ],
    }


def render() -> str:
    """The schema as checked in under docs/."""
    return json.dumps(event_json_schema(), indent=2) + "\n"
