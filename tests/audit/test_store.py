"""The store on real SQLite and PostgreSQL: migrations, exactly-once writes, dead letters,
keyset queries and batched retention."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hotseat_audit.decoding import DeadLetter, DeadLetterReason, Incoming, Origin
from hotseat_audit.query import Cursor, EventFilter
from hotseat_audit.store import AuditStore, open_store, parse_dsn
from hotseat_audit.store.migrations import LATEST, SchemaTooNew
from hotseat_common.messages.audit import PoolOutcome
from tests.audit.support import T0, counts, pool_event, raw_rows, request_events


def _incoming(events, first_seq: int = 1) -> list[Incoming]:
    return [Incoming(e, first_seq + i) for i, e in enumerate(events)]


async def test_migrations_apply_once(store: AuditStore, store_dsn: str) -> None:
    """Migrating again is a no-op and schema_version lists each version once."""
    assert await store.migrate() == LATEST
    reopened = await open_store(parse_dsn(store_dsn))
    try:
        assert await reopened.migrate() == LATEST
    finally:
        await reopened.close()
    rows = await raw_rows(store_dsn, "SELECT version FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, LATEST + 1))


async def test_newer_schema_is_refused(store: AuditStore, store_dsn: str) -> None:
    """A database migrated by a newer version makes start-up fail instead of writing."""
    if parse_dsn(store_dsn).kind == "sqlite":
        insert = "INSERT INTO schema_version (version, name, applied_at) VALUES ({}, 'x', 0)"
    else:
        insert = "INSERT INTO schema_version (version, name) VALUES ({}, 'x') RETURNING version"
    await raw_rows(store_dsn, insert.format(LATEST + 1))
    with pytest.raises(SchemaTooNew):
        await store.migrate()


async def test_write_is_idempotent_on_event_id(store: AuditStore, store_dsn: str) -> None:
    """An id seen in the same batch or an earlier one never makes a second row."""
    events = request_events(5)
    first = await store.write(_incoming([*events, events[0]]), [])
    assert first.stored == {"served": 5}
    assert first.duplicates == 1
    second = await store.write(_incoming([events[1], *request_events(0)], 100), [])
    assert second.stored == {}
    assert second.duplicates == 1
    assert await counts(store_dsn) == (5, 5)


async def test_dead_letters_stored_once_per_stream_position(
    store: AuditStore, store_dsn: str
) -> None:
    """A redelivered dead letter (same stream and sequence) is kept once, with its reason."""
    letter = DeadLetter(
        origin=Origin(stream="S", stream_seq=7, subject="p.audit.x.y", published=T0),
        payload=b"{nope",
        reason=DeadLetterReason.MALFORMED_JSON,
        detail="unexpected character",
    )
    assert (await store.write([], [letter])).dead_letters == {"malformed_json": 1}
    assert (await store.write([], [letter])).dead_letters == {}
    stored = await store.dead_letters(limit=10)
    assert len(stored) == 1
    assert stored[0].payload == b"{nope"
    assert stored[0].reason == "malformed_json"
    assert stored[0].stream_seq == 7
    assert stored[0].published == T0


async def test_keyset_pages_cover_every_match_once(store: AuditStore) -> None:
    """Paging newest first with a cursor returns every matching event exactly once, even
    when several events share a timestamp."""
    events = request_events(25, step=timedelta(0)) + request_events(25, start=T0 + timedelta(1))
    await store.write(_incoming(events), [])
    filters = EventFilter(pool=("gpu0",))
    seen: list[str] = []
    after: Cursor | None = None
    while True:
        page = await store.events(filters, limit=7, after=after)
        seen.extend(e.id for e in page)
        if len(page) < 7:
            break
        after = Cursor(page[-1].time, page[-1].id)
    assert sorted(seen) == sorted(e.id for e in events)
    assert len(seen) == len(set(seen))
    expected_order = sorted(events, key=lambda e: (e.time, e.id), reverse=True)
    assert seen == [e.id for e in expected_order]


async def test_summary_counts_by_outcome_and_member(store: AuditStore) -> None:
    """The summary counts events in the window by outcome, kind and pool/member."""
    events = [
        *request_events(3),
        pool_event(PoolOutcome.SWAP_STARTED, T0, pool="gpu0", member="coder"),
        pool_event(PoolOutcome.SWAP_STARTED, T0 + timedelta(hours=2), pool="gpu0", member="coder"),
    ]
    await store.write(_incoming(events), [])
    summary = await store.summary(T0, T0 + timedelta(hours=1))
    assert summary.total == 4
    assert summary.by_outcome == {"served": 3, "swap_started": 1}
    assert summary.by_kind == {"request": 3, "pool": 1}
    assert summary.by_pool[("gpu0", "assistant")].total == 3
    assert summary.by_pool[("gpu0", "coder")].by_outcome == {"swap_started": 1}
    assert list(summary.by_rule) == ["default"], "pool events count under no rule"
    assert summary.by_rule["default"].by_outcome == {"served": 3}


async def test_retention_deletes_only_old_rows_in_batches(
    store: AuditStore, store_dsn: str
) -> None:
    """Deleting past a cutoff removes at most ``limit`` rows per call and never newer ones."""
    events = request_events(10)
    await store.write(_incoming(events), [])
    cutoff = T0 + timedelta(seconds=7)
    assert await store.delete_older_than(cutoff, limit=4) == 4
    assert await store.delete_older_than(cutoff, limit=4) == 3
    assert await store.delete_older_than(cutoff, limit=4) == 0
    left = await raw_rows(store_dsn, "SELECT request_id FROM audit_events")
    assert sorted(r[0] for r in left) == ["req-7", "req-8", "req-9"]
