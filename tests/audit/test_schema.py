"""The checked-in JSON Schema of audit events is the generated one, and it accepts
exactly what the model accepts."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from hotseat.cli import main
from hotseat_audit.schema import event_json_schema, render
from hotseat_common.messages.audit import PoolOutcome
from tests.audit.support import T0, pool_event, request_events

CHECKED_IN = Path(__file__).resolve().parents[2] / "docs" / "audit-event.schema.json"


def test_checked_in_schema_is_the_generated_one() -> None:
    """docs/audit-event.schema.json equals `hotseat audit schema` (regenerate it if not)."""
    assert CHECKED_IN.read_text() == render(), "run: hotseat audit schema > " + str(CHECKED_IN)


def test_cli_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """`hotseat audit schema` prints the schema."""
    assert main(["audit", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == event_json_schema()


def test_published_events_validate() -> None:
    """Events as publishers serialise them validate against the schema."""
    validator = jsonschema.Draft202012Validator(event_json_schema())
    validator.check_schema(event_json_schema())
    swap = pool_event(PoolOutcome.SWAP_COMPLETED, T0, pool="p", from_member="a", to_member="b")
    for event in [*request_events(2), swap]:
        validator.validate(json.loads(event.to_bytes()))


@pytest.mark.parametrize(
    "change",
    [
        {"outcome": "swap_started"},  # a pool outcome on a request event
        {"kind": "gpu"},
        {"colour": "red"},
        {"v": 2},
        {"status": "ok"},
    ],
)
def test_schema_rejects_what_the_model_rejects(change: dict[str, object]) -> None:
    """A wrong outcome for the kind, an unknown field or version, or a wrong type fail."""
    event = json.loads(request_events(1)[0].to_bytes())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**event, **change}, event_json_schema())


@pytest.mark.parametrize("field", ["id", "time", "kind", "outcome", "v"])
def test_schema_requires_the_fields_every_event_carries(field: str) -> None:
    """Every published event carries v, id, time, kind and outcome."""
    event = json.loads(request_events(1)[0].to_bytes())
    del event[field]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(event, event_json_schema())
