"""What an upstream gets is what the client sent: the query string byte for byte, and
header values byte for byte, or the request refused before it reaches any upstream
(both found by tests/security/test_fuzz.py). Raw sockets against a router process whose
upstream records each request as it arrived."""

from __future__ import annotations

import json

from tests.security.conftest import CLIENT_KEY, RecordedRouter
from tests.security.recording import exchange

BODY = b'{"model": "p", "messages": []}'


def request(target: bytes, *headers: tuple[bytes, bytes]) -> bytes:
    lines = [
        b"POST " + target + b" HTTP/1.1",
        b"host: router",
        b"authorization: Bearer " + CLIENT_KEY.encode(),
        b"content-type: application/json",
        *(name + b": " + value for name, value in headers),
        b"content-length: " + str(len(BODY)).encode(),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + BODY


QUERIES = [b"%zz", b"a=%2F&b=%20c", b"x=%C3%A9&y", b"a=/?b", b"%", b"q=%E9"]


def test_the_query_string_reaches_the_upstream_byte_for_byte(
    recorded_router: RecordedRouter,
) -> None:
    """Percent escapes, valid or not, and characters such as ``/`` and ``?`` in the query
    reach the upstream exactly as the client wrote them, never encoded a second time
    (``%zz`` used to arrive as ``%25zz``)."""
    for query in QUERIES:
        target = b"/v1/chat/completions?" + query
        answer = exchange(recorded_router.address, request(target), head_only=False, timeout=30)
        assert answer.status == 200, answer
        assert recorded_router.upstream.requests[-1].target.encode() == target


def test_a_header_value_reaches_the_upstream_as_sent_or_is_refused(
    recorded_router: RecordedRouter,
) -> None:
    """A UTF-8 header value reaches the upstream byte for byte; a value with obs-text
    bytes that are not UTF-8 (which the upstream client would re-encode, so that the
    upstream read other bytes) is refused with 400 and reaches no upstream."""
    upstream = recorded_router.upstream
    value = "caf\u00e9 \u2603".encode()
    answer = exchange(
        recorded_router.address,
        request(b"/v1/chat/completions", (b"x-note", value)),
        head_only=False,
        timeout=30,
    )
    assert answer.status == 200, answer
    received = dict(upstream.requests[-1].headers)["x-note"]
    assert received.encode("latin-1") == value  # the recorder reads headers as Latin-1

    before = upstream.count()
    answer = exchange(
        recorded_router.address,
        request(b"/v1/chat/completions", (b"x-note", b"caf\xe9")),
        head_only=False,
        timeout=30,
    )
    assert answer.status == 400, answer
    error = json.loads(answer.body)["error"]
    assert error["code"] == "invalid_request", error
    assert "not UTF-8" in error["message"]
    assert upstream.since(before) == []
