"""The query API over real HTTP, on both stores: filters, keyset pagination, summaries
and validation errors, checked against the events the test published."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from hotseat.launcher import Managed, free_port, start_service
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import stream_name
from tests.audit.support import T0, publish_events
from tests.support.audit_trail import wait_consumed
from tests.support.infra import unique_prefix

REQUEST_OUTCOMES = [
    RequestOutcome.SERVED,
    RequestOutcome.SERVED,
    RequestOutcome.SERVED,
    RequestOutcome.POOL_INCUMBENT_BUSY,
    RequestOutcome.POOL_ACTIVATION_TIMEOUT,
    RequestOutcome.NO_ROUTE,
]
POOL_OUTCOMES = [PoolOutcome.BUSY_SKIP, PoolOutcome.SWAP_STARTED, PoolOutcome.SWAP_COMPLETED]


def dataset(n: int = 150) -> list[AuditEvent]:
    """Events across kinds, outcomes, pools, members, routers and rules, some sharing a
    timestamp (to exercise the id tie-break) and all with microsecond times."""
    rng = random.Random(5)
    events = []
    for i in range(n):
        when = T0 + timedelta(seconds=(i // 3) * 37, microseconds=(i // 3) * 1234)
        pool, member = rng.choice([("gpu0", "assistant"), ("gpu0", "coder"), ("gpu1", "embed")])
        if rng.random() < 0.7:
            event = AuditEvent(
                kind="request",
                outcome=rng.choice(REQUEST_OUTCOMES),
                time=when,
                request_id=f"req-{i}",
                router=rng.choice(["r1", "r2"]),
                rule=rng.choice(["rule-a", "rule-b"]),
                pool=pool,
                member=member,
                backend=member,
                status=200,
                duration_ms=float(i),
            )
        else:
            event = AuditEvent(
                kind="pool",
                outcome=rng.choice(POOL_OUTCOMES),
                time=when,
                request_id=f"req-{i - 1}",
                controller="c1",
                router="r1",
                pool=pool,
                member=member,
                from_member="coder",
                to_member=member,
                epoch=i,
            )
        events.append(event)
    return events


@dataclass
class Populated:
    url: str
    events: list[AuditEvent]

    def expected(self, keep: Callable[[AuditEvent], bool]) -> list[str]:
        matching = [e for e in self.events if keep(e)]
        return [e.id for e in sorted(matching, key=lambda e: (e.time, e.id), reverse=True)]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
async def populated(
    request: pytest.FixtureRequest,
    nats_server: Managed,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Populated]:
    """One audit service per store, holding :func:`dataset`, shared by this module."""
    prefix = unique_prefix()
    workdir = tmp_path_factory.mktemp("audit-api")
    schema_dsn: str | None = None
    if request.param == "sqlite":
        dsn = f"sqlite:///{workdir / 'audit.db'}"
    else:
        schema_dsn = request.getfixturevalue("postgres_dsn")
        with psycopg.connect(schema_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{prefix}"')
        dsn = f"{schema_dsn}?options={quote(f'-csearch_path={prefix}')}"
    subjects = Subjects(prefix)
    nc = await open_nats(nats_server.url)
    js = nc.jetstream()
    await ensure_audit_stream(js, AuditStreamSpec(name=stream_name(prefix), subjects=subjects))
    events = dataset()
    acks = await publish_events(js, subjects, events)
    service = start_service(
        "audit",
        "hotseat-audit",
        ["--nats-url", nats_server.url, "--subject-prefix", prefix,
         "--audit-stream", stream_name(prefix), "--dsn", dsn],
        port=free_port(),
        log_dir=workdir,
    )  # fmt: skip
    try:
        await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
        yield Populated(url=service.url, events=events)
    finally:
        service.stop()
        await nc.drain()
        if schema_dsn is not None:
            with psycopg.connect(schema_dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{prefix}" CASCADE')


async def _all_pages(
    client: httpx.AsyncClient, params: dict[str, Any], limit: int
) -> tuple[list[str], int]:
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        query = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/v1/events", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["events"]) <= limit
        ids.extend(e["id"] for e in body["events"])
        pages += 1
        cursor = body["next"]
        if cursor is None:
            return ids, pages


T1 = T0 + timedelta(seconds=500)
T2 = T0 + timedelta(seconds=1200)

FILTERS: list[tuple[dict[str, Any], Callable[[AuditEvent], bool]]] = [
    ({}, lambda e: True),
    ({"outcome": "served"}, lambda e: e.outcome == "served"),
    ({"outcome": ["no_route", "busy_skip"]}, lambda e: e.outcome in {"no_route", "busy_skip"}),
    ({"kind": "pool"}, lambda e: e.kind == "pool"),
    ({"pool": "gpu1"}, lambda e: e.pool == "gpu1"),
    ({"pool": "gpu0", "member": "coder"}, lambda e: (e.pool, e.member) == ("gpu0", "coder")),
    ({"member": "embed"}, lambda e: e.member == "embed"),
    ({"router": "r2"}, lambda e: e.router == "r2"),
    (
        {"rule": "rule-b", "outcome": "served"},
        lambda e: (e.rule, e.outcome) == ("rule-b", "served"),
    ),
    ({"request_id": "req-41"}, lambda e: e.request_id == "req-41"),
    ({"since": T1.isoformat()}, lambda e: e.time >= T1),
    ({"until": T1.isoformat()}, lambda e: e.time < T1),
    (
        {"since": T1.isoformat(), "until": T2.isoformat(), "kind": "request", "router": "r1"},
        lambda e: T1 <= e.time < T2 and e.kind == "request" and e.router == "r1",
    ),
    ({"pool": "gpu9"}, lambda e: False),
]


@pytest.mark.parametrize(("params", "keep"), FILTERS, ids=[str(f[0]) for f in FILTERS])
async def test_filters_return_exactly_the_matching_events(
    populated: Populated, params: dict[str, Any], keep: Callable[[AuditEvent], bool]
) -> None:
    """Each filter (and combination) returns exactly the matching events, newest first."""
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        ids, pages = await _all_pages(client, params, limit=1000)
    assert pages == 1
    assert ids == populated.expected(keep)


@pytest.mark.parametrize(("params", "keep"), FILTERS[:3] + FILTERS[-3:-1])
async def test_cursor_pages_cover_every_match_once(
    populated: Populated, params: dict[str, Any], keep: Callable[[AuditEvent], bool]
) -> None:
    """Following ``next`` with the same filters walks every match exactly once, in order,
    and the last page (never an empty one) has ``next: null``."""
    expected = populated.expected(keep)
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        ids, pages = await _all_pages(client, params, limit=7)
    assert ids == expected
    assert pages == max(1, -(-len(expected) // 7)), "no trailing empty page"


async def test_events_come_back_as_published(populated: Populated) -> None:
    """A stored event reads back field for field as it was published."""
    event = populated.events[10]
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        body = (await client.get("/v1/events", params={"request_id": event.request_id})).json()
    by_id = {e["id"]: e for e in body["events"]}
    assert AuditEvent.model_validate(by_id[event.id]) == event
    assert by_id[event.id] == event.model_dump(mode="json", exclude_none=True)


async def test_cursor_is_bound_to_its_filters(populated: Populated) -> None:
    """A cursor used with different filters, or not issued by the service, is a 400."""
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        first = (await client.get("/v1/events", params={"outcome": "served", "limit": 2})).json()
        assert first["next"]
        other = await client.get(
            "/v1/events", params={"outcome": "no_route", "limit": 2, "cursor": first["next"]}
        )
        garbage = await client.get("/v1/events", params={"cursor": "not-a-cursor"})
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "invalid_cursor"
    assert "different filters" in other.json()["error"]["message"]
    assert garbage.status_code == 400
    assert garbage.json()["error"]["code"] == "invalid_cursor"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "last tuesday"}, "since"),
        ({"until": "2030-13-01T00:00:00Z"}, "until"),
        ({"outcome": "exploded"}, "outcome"),
        ({"kind": "gpu"}, "kind"),
        ({"limit": 0}, "limit"),
        ({"limit": 5000}, "limit"),
        ({"since": T2.isoformat(), "until": T1.isoformat()}, "until"),
        ({"request_id": ["req-1", "req\x002"]}, "request_id"),
        ({"member": "coder\x00"}, "member"),
    ],
)
async def test_invalid_parameters_are_422_naming_the_field(
    populated: Populated, params: dict[str, Any], field: str
) -> None:
    """A parameter that does not validate gets 422 with the field and a message."""
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        response = await client.get("/v1/events", params=params)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_parameter"
    assert [f["field"] for f in error["fields"]] == [field]
    assert error["message"].startswith(f"{field}: ")


async def test_summary_counts_match_the_window(populated: Populated) -> None:
    """The summary counts events in [since, until) by outcome, kind and pool/member."""
    window = [e for e in populated.events if T1 <= e.time < T2]
    async with httpx.AsyncClient(base_url=populated.url, timeout=10) as client:
        response = await client.get(
            "/v1/summary", params={"since": T1.isoformat(), "until": T2.isoformat()}
        )
        default = (await client.get("/v1/summary")).json()
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == len(window)
    assert body["by_outcome"] == dict(Counter(e.outcome for e in window))
    assert body["by_kind"] == dict(Counter(e.kind for e in window))
    members = Counter((e.pool, e.member) for e in window)
    assert {(p["pool"], p["member"]): p["total"] for p in body["by_pool"]} == dict(members)
    for entry in body["by_pool"]:
        assert entry["by_outcome"] == dict(
            Counter(
                e.outcome for e in window if (e.pool, e.member) == (entry["pool"], entry["member"])
            )
        )
    requests = [e for e in window if e.kind == "request"]
    assert {r["rule"]: r["total"] for r in body["by_rule"]} == dict(
        Counter(e.rule for e in requests)
    )
    for entry in body["by_rule"]:
        assert entry["by_outcome"] == dict(
            Counter(e.outcome for e in requests if e.rule == entry["rule"])
        )
    assert default["total"] == 0, "the default window is the last 24 hours; the data is older"
