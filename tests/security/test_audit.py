"""The audit query API against hostile clients, on both stores: every input is answered
with 400 or 422 and a reason (never a 500, never a 503 for what the store would refuse),
and a pagination cursor is accepted only as signed by the deployment's cursor key."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hotseat.launcher import Managed, find_binary, free_port, start_service
from hotseat_audit.query import Cursor, EventFilter
from hotseat_common.audit_stream import AuditStreamSpec, ensure_audit_stream
from hotseat_common.connections import open_nats
from hotseat_common.subjects import AUDIT_DURABLE, Subjects
from tests.audit.conftest import stream_name
from tests.audit.support import drop_schema, postgres_schema_dsn, publish_events, request_events
from tests.support.audit_trail import wait_consumed
from tests.support.infra import unique_prefix

CURSOR_KEY = "audit-cursor-key-5d1e9b7a3c60f284"
EVENTS = 12
NOT_VALID = "cursor is not valid"


@dataclass
class Deployment:
    shared: Managed
    """Started with :data:`CURSOR_KEY`."""
    replica: Managed
    """Another replica with the same key, given as a flag."""
    lone: Managed
    """No key configured: signs with a random key of its own."""
    events: int


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
async def deployment(
    request: pytest.FixtureRequest,
    nats_server: Managed,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Deployment]:
    """Three audit services on one store holding :data:`EVENTS` events."""
    prefix = unique_prefix()
    workdir = tmp_path_factory.mktemp("audit-hostile")
    base: str | None = None
    if request.param == "sqlite":
        dsn = f"sqlite:///{workdir / 'audit.db'}"
    else:
        base = request.getfixturevalue("postgres_dsn")
        dsn = postgres_schema_dsn(base, prefix)
    subjects = Subjects(prefix)
    nc = await open_nats(nats_server.url)
    js = nc.jetstream()
    await ensure_audit_stream(js, AuditStreamSpec(name=stream_name(prefix), subjects=subjects))
    acks = await publish_events(js, subjects, request_events(EVENTS))
    args = [
        "--nats-url", nats_server.url,
        "--subject-prefix", prefix,
        "--audit-stream", stream_name(prefix),
        "--dsn", dsn,
        "--log-format", "json",
    ]  # fmt: skip
    started: list[Managed] = []

    def start(name: str, *extra: str, env: dict[str, str] | None = None) -> Managed:
        proc = start_service(
            "audit",
            "hotseat-audit",
            [*args, *extra],
            port=free_port(),
            log_dir=workdir / name,
            env=env,
        )
        started.append(proc)
        return proc

    try:
        shared = start("shared", env={"HOTSEAT_AUDIT_CURSOR_KEY": CURSOR_KEY})
        replica = start("replica", "--cursor-key", CURSOR_KEY)
        lone = start("lone")
        await wait_consumed(js, stream_name(prefix), AUDIT_DURABLE, acks[-1].seq)
        yield Deployment(shared=shared, replica=replica, lone=lone, events=EVENTS)
    finally:
        for proc in started:
            proc.stop()
        await nc.drain()
        if base is not None:
            drop_schema(base, prefix)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def _get(url: str, path: str, params: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return await client.get(path, params=params)


async def _first_cursor(url: str) -> str:
    response = await _get(url, "/v1/events", {"limit": 2})
    assert response.status_code == 200, response.text
    cursor = response.json()["next"]
    assert isinstance(cursor, str)
    return cursor


def _assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code
    assert error["message"], "an error says why"
    return error


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/events", {"since": "0001-01-01T00:00:00+14:00"}, "since"),
        ("/v1/events", {"until": "9999-12-31T23:59:59-14:00"}, "until"),
        ("/v1/summary", {"since": "0001-01-01T00:00:00+14:00"}, "since"),
        ("/v1/summary", {"until": "9999-12-31T23:59:59-14:00"}, "until"),
        ("/v1/summary", {"until": "0001-01-01T00:00:00Z"}, "since"),
    ],
)
async def test_times_beyond_the_calendar_in_utc_are_422(
    deployment: Deployment, path: str, params: dict[str, str], field: str
) -> None:
    """A date-time that converts to UTC before year 1 or after 9999 (or a summary window
    that would start before year 1) is a 422 naming the field, not an overflow."""
    error = _assert_error(await _get(deployment.shared.url, path, params), 422, "invalid_parameter")
    assert [f["field"] for f in error["fields"]] == [field]


async def test_a_summary_window_reaching_year_1_is_clamped(deployment: Deployment) -> None:
    """``until`` within the first day of year 1: the default 24-hour window starts at the
    earliest date-time instead of overflowing."""
    response = await _get(deployment.shared.url, "/v1/summary", {"until": "0001-01-01T06:00:00Z"})
    assert response.status_code == 200, response.text
    assert response.json()["since"].startswith("0001-01-01T00:00:00")


@pytest.mark.parametrize("before", [str(2**63), "99999999999999999999999"])
async def test_dead_letter_position_beyond_64_bits_is_422(
    deployment: Deployment, before: str
) -> None:
    """``before`` larger than any id a store can hold is a 422, not an integer overflow."""
    response = await _get(deployment.shared.url, "/v1/dead-letters", {"before": before})
    error = _assert_error(response, 422, "invalid_parameter")
    assert [f["field"] for f in error["fields"]] == ["before"]
    largest = await _get(deployment.shared.url, "/v1/dead-letters", {"before": str(2**63 - 1)})
    assert largest.status_code == 200, largest.text


def _edited(cursor: str, change: dict[str, Any]) -> str:
    """``cursor`` with its payload edited and its signature (if any) kept."""
    payload, dot, mac = cursor.partition(".")
    data = orjson.loads(_unb64(payload))
    return _b64(orjson.dumps({**data, **change})) + dot + mac


def _made_up(data: object) -> str:
    """A cursor a client wrote itself: base64 of JSON, unsigned (json, not orjson: it
    writes integers beyond 64 bits too)."""
    return _b64(json.dumps(data).encode())


FINGERPRINT = EventFilter().fingerprint()
"""The fingerprint of the unfiltered query, which anyone can compute."""


async def test_forged_cursors_are_400(deployment: Deployment) -> None:
    """A cursor the service did not sign, an edited one, or bytes that are no cursor at
    all: each is a 400 "cursor is not valid", never a 500 and never a page."""
    real = await _first_cursor(deployment.shared.url)
    payload = real.partition(".")[0]
    forged = {
        "far future": _made_up({"t": 10**18, "i": "x", "f": FINGERPRINT}),
        "far past": _made_up({"t": -(10**18), "i": "x", "f": FINGERPRINT}),
        "beyond 64 bits": _made_up({"t": 10**30, "i": "x", "f": FINGERPRINT}),
        "NUL in id": _made_up({"t": 1, "i": "a\x00b", "f": FINGERPRINT}),
        "id not text": _made_up({"t": 1, "i": 5, "f": FINGERPRINT}),
        "well formed, made up": _made_up({"t": 1, "i": "x", "f": FINGERPRINT}),
        "a list": _made_up([1, "x", FINGERPRINT]),
        "random bytes": _b64(bytes(range(256))),
        "edited time": _edited(real, {"t": 0}),
        "edited id": _edited(real, {"i": "zzzz"}),
        "signature dropped": payload,
        "signature truncated": real[:-4],
        "signature empty": payload + ".",
        "two signatures": real + "." + real.partition(".")[2],
        "not base64": "%%%.###",
        "non-ASCII": "curs\u00f6r.\u00e9",
        "NUL": "\x00",
        "very long": "A" * 6000 + "." + "B" * 43,
    }
    wrong = {}
    for name, cursor in forged.items():
        response = await _get(deployment.shared.url, "/v1/events", {"limit": 2, "cursor": cursor})
        if response.status_code != 400 or not response.json()["error"]["message"].startswith(
            NOT_VALID
        ):
            wrong[name] = (response.status_code, response.text[:200])
    assert not wrong


async def test_a_cursor_signed_with_another_key_is_400(deployment: Deployment) -> None:
    """A cursor well formed for this very query but signed with a key the deployment does
    not have is refused."""
    cursor = Cursor(request_events(1)[0].time, "x").encode(EventFilter(), b"another key" * 3)
    response = await _get(deployment.shared.url, "/v1/events", {"limit": 2, "cursor": cursor})
    error = _assert_error(response, 400, "invalid_cursor")
    assert error["message"].startswith(NOT_VALID)


async def test_a_cursor_works_on_every_replica_with_the_key_and_no_other(
    deployment: Deployment,
) -> None:
    """Replicas configured with the same key (by variable or by flag) continue each
    other's pages; a service that generated its own key refuses their cursors, and they
    refuse its."""
    cursor = await _first_cursor(deployment.shared.url)
    pages = []
    for proc in (deployment.shared, deployment.replica):
        response = await _get(proc.url, "/v1/events", {"limit": 2, "cursor": cursor})
        assert response.status_code == 200, response.text
        pages.append([e["id"] for e in response.json()["events"]])
    assert pages[0] == pages[1]
    assert len(pages[0]) == 2
    refused = await _get(deployment.lone.url, "/v1/events", {"limit": 2, "cursor": cursor})
    _assert_error(refused, 400, "invalid_cursor")
    own = await _first_cursor(deployment.lone.url)
    assert (await _get(deployment.lone.url, "/v1/events", {"cursor": own})).status_code == 200
    back = await _get(deployment.shared.url, "/v1/events", {"limit": 2, "cursor": own})
    _assert_error(back, 400, "invalid_cursor")


def _log_events(proc: Managed) -> list[dict[str, Any]]:
    lines = []
    for line in proc.log_text().splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict):
            lines.append(record)
    return lines


async def test_a_generated_cursor_key_is_logged(deployment: Deployment) -> None:
    """Without a configured key the service says, in a structured line, that its cursors
    will not survive a restart or work across replicas; with one it says nothing of it."""
    generated = [
        r for r in _log_events(deployment.lone) if r.get("event") == "audit_cursor_key_generated"
    ]
    assert len(generated) == 1
    assert generated[0]["level"] == "warning"
    assert "restart" in generated[0]["detail"]
    assert "replicas" in generated[0]["detail"]
    for proc in (deployment.shared, deployment.replica):
        events = [r.get("event") for r in _log_events(proc)]
        assert "audit_started" in events
        assert "audit_cursor_key_generated" not in events
        assert CURSOR_KEY not in proc.log_text()


def test_a_short_cursor_key_is_refused_without_showing_it(tmp_path: Path) -> None:
    """A key under 16 characters stops the service at start-up (exit 2) with the rule,
    and the message never quotes the key."""
    short = "short-key-77a1"
    result = subprocess.run(
        [
            find_binary("hotseat-audit"),
            "--cursor-key",
            short,
            "--dsn",
            f"sqlite:///{tmp_path}/a.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "cursor_key must have at least 16 characters" in result.stderr
    assert short not in result.stdout + result.stderr


HOSTILE: list[tuple[str, str]] = [
    ("/v1/events", "limit=99999999999999999999999"),
    ("/v1/events", "limit=-1"),
    ("/v1/events", "limit=1e3"),
    ("/v1/events", "limit=%00"),
    ("/v1/events", "pool=" + "p" * 6000),
    ("/v1/events", "request_id=" + "r" * 6000),
    ("/v1/events", "&".join(["router=r"] * 1500)),
    ("/v1/events", "pool=%ED%A0%80"),
    ("/v1/events", "pool=%FF%FE"),
    ("/v1/events", "member=%F0%9F%98%80"),
    ("/v1/events", "rule=a%00"),
    ("/v1/events", "outcome=%00"),
    ("/v1/events", "kind=%ED%A0%80"),
    ("/v1/events", "since=%00"),
    ("/v1/events", "since=1e400"),
    ("/v1/events", "since=nan"),
    ("/v1/events", "since=-1"),
    ("/v1/events", "since=" + "9" * 5000),
    ("/v1/events", "until=0001-01-01T00:00:00-00:01"),
    ("/v1/events", "since=0001-01-01T00:00:00%2B14:00&until=9999-12-31T23:59:59-14:00"),
    ("/v1/events", "cursor=%ED%A0%80"),
    ("/v1/events", "cursor=" + "x" * 6000),
    ("/v1/summary", "since=0001-01-01T00:00:00%2B14:00"),
    ("/v1/summary", "until=0001-01-01T00:00:00Z"),
    ("/v1/summary", "since=9999-12-31T23:59:59.999999Z"),
    ("/v1/summary", "since=inf"),
    ("/v1/dead-letters", "before=99999999999999999999999"),
    ("/v1/dead-letters", "before=-99999999999999999999999"),
    ("/v1/dead-letters", "before=%00"),
    ("/v1/dead-letters", "before=1e30"),
    ("/v1/dead-letters", "limit=99999999999999999999999"),
]


async def test_hostile_parameters_are_answered_with_a_reason(deployment: Deployment) -> None:
    """Whatever a client puts in the query string, the answer is a 200, or a 400/422 with
    an error body that says why: never a 500, and never a 503 (the store is up)."""
    wrong = {}
    async with httpx.AsyncClient(base_url=deployment.shared.url, timeout=10) as client:
        for path, query in HOSTILE:
            response = await client.get(f"{path}?{query}")
            ok = response.status_code == 200 or (
                response.status_code in {400, 422} and response.json()["error"]["message"]
            )
            if not ok:
                wrong[f"{path}?{query[:60]}"] = (response.status_code, response.text[:200])
    assert not wrong
