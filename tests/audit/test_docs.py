"""docs/audit.md stays true: its subscriber snippet runs, its settings table is complete."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from nats.aio.client import Client as NatsClient

from hotseat_audit.settings import AuditSettings
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.settings import ServiceSettings
from hotseat_common.subjects import Subjects
from tests.audit.conftest import stream_name
from tests.audit.support import publish_events, request_events

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def _snippet() -> str:
    text = DOC.read_text()
    match = re.search(r"<!-- subscriber-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "the subscriber example is missing from docs/audit.md"
    return match.group(1)


async def test_subscriber_example_receives_published_events(
    nc: NatsClient, prefix: str, tmp_path: Path
) -> None:
    """The documented nats-py subscriber, run as is, prints every published event once."""
    subjects = Subjects(prefix)
    stream = stream_name(prefix)
    await ensure_audit_stream(nc.jetstream(), AuditStreamSpec(name=stream, subjects=subjects))
    events = request_events(3)
    await publish_events(nc.jetstream(), subjects, events)
    script = tmp_path / "subscriber.py"
    script.write_text(_snippet())
    env = {
        "HOTSEAT_NATS_URL": str(nc.connected_url.geturl()),
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": stream,
        "DURABLE": "docs-example",
        "STOP_AFTER": "3",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    printed_ids = [line.split()[-1] for line in out.decode().splitlines()]
    assert printed_ids == [e.id for e in events]


def test_settings_table_lists_every_audit_setting() -> None:
    """Each audit-specific setting appears in docs/audit.md with its flag and variable."""
    text = DOC.read_text()
    own = set(AuditSettings.model_fields) - set(ServiceSettings.model_fields)
    for name in own:
        assert f"`--{name.replace('_', '-')}`" in text, name
        assert f"`HOTSEAT_AUDIT_{name.upper()}`" in text, name
