"""A fuzz run against a live router process over raw sockets: hypothesis draws whole
requests (method, path and query, header names and values with odd bytes, framing, and a
body that is arbitrary bytes or a JSON-ish object with odd nesting, duplicate keys, huge
numbers, bad UTF-8, escapes and odd model names), with a fixed seed and a time budget.
The upstream records every request it receives. After every request:

- the router did not answer 5xx: with a healthy upstream, no pools and one client at a
  time, none of the router's 5xx (docs/router.md, "Errors") applies; the body budget is
  at least ``maxBodyBytes``, so one request's body always fits;
- the process is alive and answers ``/healthz``;
- an answer the router gave itself (no ``x-hotseat-backend``) came with no request at
  the upstream, an upstream's answer with exactly one, and a connection closed without
  an answer with none;
- a forwarded body is strict JSON with no key twice and a non-empty string ``model``; it
  is the client's bytes with only the top-level model value replaced when the backend
  renames the model (else the client's bytes exactly); the query string and a random
  end-to-end header value arrive as the client sent them.

Budget: ``HOTSEAT_FUZZ_SECONDS`` (default 60); ``make fuzz`` runs 30 minutes
(``FUZZ_SECONDS=...`` for another length). The seed is fixed (``HOTSEAT_FUZZ_SEED``
picks another) and nothing is kept between runs. With ``-s`` the run prints how many
requests it sent and how they were answered.
"""

from __future__ import annotations

import http.client
import json
import os
import string
import time
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from tests.security.conftest import CLIENT_KEY, SERVED_AS, RecordedRouter
from tests.security.recording import Answer, Silent, exchange

T = TypeVar("T")
FUZZ_SECONDS = float(os.environ.get("HOTSEAT_FUZZ_SECONDS", "60"))
FUZZ_SEED = int(os.environ.get("HOTSEAT_FUZZ_SEED", "20261202"))
KEY = CLIENT_KEY
ANSWER_WAIT_S = 30.0
"""How long a request may go unanswered before the router is called silent (the head
and body timeouts are 1 s; a bound on a hang, not a measured figure)."""


# ---- bodies -------------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    raw: bytes
    model_slot: tuple[int, int] | None = None
    """Where the one top-level ``model`` value lies in ``raw``, when the body was built
    as an object with exactly one such key."""


def mostly(nice: st.SearchStrategy[T], odd: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``nice`` four times in five: most requests get far enough to be forwarded."""
    return st.sampled_from([True, True, True, True, False]).flatmap(
        lambda is_nice: nice if is_nice else odd
    )


WS = st.sampled_from([b"", b"", b" ", b"\n", b"\t", b"\r\n  ", b"    "])
WORDS = st.text(st.characters(codec="utf-8"), max_size=8)
ODD_STRINGS = st.sampled_from(
    [
        b'"\\ud800"',  # a lone surrogate escape
        b'"\\udc00\\ud800"',
        b'"\xed\xa0\x80"',  # a surrogate written as UTF-8
        b'"\xff\xfe"',  # not UTF-8
        b'"\xc3"',  # a truncated sequence
        b'"a\x00b"',  # a raw control character
        b'"\\x41"',  # no such escape
        b'"\\u00"',
        b'"\\"',
        b'"\\\\"',
        b'"\\u0000"',
        b'"\xf0\x9f\x98\x80"',
    ]
)
NUMBERS = mostly(
    st.one_of(
        st.integers().map(lambda n: str(n).encode()),
        st.integers(20, 5000).map(lambda n: b"1" + b"0" * n),
        st.integers(20, 400).map(lambda n: b"-0." + b"0" * n + b"1"),
        st.sampled_from([b"1E+2", b"-0.0", b"-0", b"0.1e-999", b"1.50", b"9" * 40, b"1e308"]),
    ),
    st.sampled_from(
        [
            b"1e400",
            b"-1e400",
            b"01",
            b"1.",
            b".5",
            b"+1",
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"0x10",
            b"1e",
        ]
    ),
)
LITERALS = mostly(
    st.sampled_from([b"true", b"false", b"null"]),
    st.sampled_from([b"tru", b"nul", b"None", b"True"]),
)


def json_string(text: str, style: int) -> bytes:
    """``text`` as a JSON string: raw UTF-8, ASCII escapes, or every character escaped."""
    if style == 0:
        return json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if style == 1:
        return json.dumps(text).encode()
    units = text.encode("utf-16-be", "surrogatepass")
    hexes = (units[i : i + 2].hex() for i in range(0, len(units), 2))
    return b'"' + b"".join(b"\\u" + h.encode() for h in hexes) + b'"'


STRINGS = mostly(st.builds(json_string, WORDS, st.integers(0, 2)), ODD_STRINGS)


def nested(depth: int, opener: bytes, closer: bytes, inner: bytes) -> bytes:
    return opener * depth + inner + closer * depth


DEEP = st.builds(
    nested,
    st.one_of(st.integers(1, 40), st.integers(120, 300)),
    st.sampled_from([b"[", b'{"a":', b'[{"b":']),
    st.sampled_from([b"]", b"}", b"}]"]),
    st.sampled_from([b"1", b'"x"', b"[]", b"{}"]),
)


def _array(items: list[bytes], ws: bytes) -> bytes:
    return b"[" + ws + (b"," + ws).join(items) + ws + b"]"


def _object(pairs: list[tuple[bytes, bytes]], ws: bytes) -> bytes:
    return b"{" + ws + b",".join(k + ws + b":" + ws + v for k, v in pairs) + ws + b"}"


VALUES = st.recursive(
    st.one_of(STRINGS, NUMBERS, LITERALS, DEEP),
    lambda inner: st.one_of(
        st.builds(_array, st.lists(inner, max_size=4), WS),
        st.builds(_object, st.lists(st.tuples(STRINGS, inner), max_size=4), WS),
        # The same key twice in one object, deep inside.
        st.builds(lambda k, a, b, ws: _object([(k, a), (k, b)], ws), STRINGS, inner, inner, WS),
    ),
    max_leaves=12,
)


def _unique_keys(words: list[str], styles: list[int]) -> list[bytes]:
    return [json_string(w, styles[i % len(styles)]) for i, w in enumerate(words)]


NICE_STRINGS = st.builds(json_string, WORDS, st.integers(0, 2))
NICE_KEYS = st.builds(
    _unique_keys,
    st.lists(WORDS.filter(lambda w: w != "model"), unique=True, max_size=4),
    st.lists(st.integers(0, 2), min_size=1, max_size=4),
)
NICE_VALUES = st.recursive(
    st.one_of(
        NICE_STRINGS,
        st.integers().map(lambda n: str(n).encode()),
        st.sampled_from([b"true", b"false", b"null", b"1.5e3", b"-0.0", b"1" + b"0" * 30]),
    ),
    lambda inner: st.one_of(
        st.builds(_array, st.lists(inner, max_size=4), WS),
        st.builds(
            lambda keys, values, ws: _object(list(zip(keys, values, strict=False)), ws),
            NICE_KEYS,
            st.lists(inner, min_size=4, max_size=4),
            WS,
        ),
    ),
    max_leaves=12,
)
MODEL_KEYS = st.sampled_from(
    [b'"model"', b'"model"', b'"model"', b'"mod\\u0065l"', b'"\\u006d\\u006f\\u0064\\u0065\\u006c"']
)
NICE_MODELS = st.one_of(
    st.sampled_from([b'"m"', b'"\\u006d"', b'"p"', b'"p-\xc3\xa9t\xc3\xa9"', b'"p\\n"']),
    st.builds(
        json_string,
        st.sampled_from(["m", "p", "p\u00e9", "p\U0001f600", "m "]),
        st.integers(0, 2),
    ),
    st.builds(json_string, WORDS.map(lambda w: "p" + w), st.integers(0, 2)),
)
MODEL_VALUES = mostly(
    NICE_MODELS,
    st.one_of(
        st.sampled_from([b'""', b'"served-m"', b'"*"', b"1", b"null", b'["m"]', b'{"m":1}']),
        STRINGS,
    ),
)
OTHER_KEYS = st.one_of(
    st.sampled_from([b'"messages"', b'"stream"', b'"input"', b'"prompt"', b'"n"']),
    STRINGS,
)
PADDING = st.sampled_from([0, 0, 0, 0, 100, 5000, 5900, 6100, 8000, 9000])


@st.composite
def objects(draw: st.DrawFn) -> Body:
    """A top-level object, its members in any order: zero, one or two ``model`` keys,
    other keys (maybe one of them twice), ``stream``, and maybe a long padding string."""
    members: list[tuple[bytes, bytes, bool]] = []
    if draw(st.integers(0, 2)):
        # A body the router should take: one model, keys once each, any valid values.
        members.append((draw(MODEL_KEYS), draw(NICE_MODELS), True))
        keys = draw(NICE_KEYS)
        members += [(key, draw(NICE_VALUES), False) for key in keys]
        stream = draw(st.sampled_from([None, b"true", b"false"]))
        if stream is not None and b'"stream"' not in keys:
            members.append((b'"stream"', stream, False))
    else:
        for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
            members.append((draw(MODEL_KEYS), draw(MODEL_VALUES), True))
        for _ in range(draw(st.integers(0, 4))):
            members.append((draw(OTHER_KEYS), draw(VALUES), False))
        if draw(st.booleans()):
            members.append((b'"stream"', draw(st.sampled_from([b"true", b'"yes"'])), False))
        if members and draw(st.integers(0, 4)) == 0:
            members.append(draw(st.sampled_from(members)))
    pad = draw(PADDING)
    if pad:
        members.append((b'"pad"', b'"' + b"x" * pad + b'"', False))
    members = draw(st.permutations(members))
    ws, sep = draw(WS), draw(WS)
    raw = b"{" + ws
    slot = None
    models = sum(1 for *_, is_model in members if is_model)
    for i, (key, value, is_model) in enumerate(members):
        if i:
            raw += sep + b"," + ws
        raw += key + sep + b":" + ws
        if is_model and models == 1:
            slot = (len(raw), len(raw) + len(value))
        raw += value
    return Body(raw + ws + b"}", slot)


def mutated(body: Body, at: int, how: int, junk: bytes) -> Body:
    """``body`` cut short, with bytes inserted, or with bytes after it (no slot kept)."""
    at = at % (len(body.raw) + 1)
    if how == 0:
        return Body(body.raw[:at])
    if how == 1:
        return Body(body.raw[:at] + junk + body.raw[at:])
    return Body(body.raw + junk)


BODIES = st.one_of(
    objects(),
    objects(),
    objects(),
    objects(),
    objects(),
    objects(),
    st.builds(mutated, objects(), st.integers(0, 10**6), st.integers(0, 2), st.binary(max_size=8)),
    st.binary(max_size=64).map(Body),
    VALUES.map(Body),
    st.just(Body(b"")),
)


# ---- requests -----------------------------------------------------------------------

PROXY = [b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"]
METHODS = mostly(
    st.sampled_from([b"POST"] * 12 + [b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"]),
    st.sampled_from([b"post", b"CONNECT", b"TRACE", b"BREW", b"POST POST", b""]),
)
PATHS = mostly(
    st.sampled_from(PROXY),
    st.sampled_from(
        [
            b"/v1/models",
            b"/v1/nope",
            b"/healthz",
            b"/readyz",
            b"/metrics",
            b"/openapi.json",
            b"/",
            b"/v1/chat/completions/",
            b"/v1//chat/completions",
            b"/v1/chat%2Fcompletions",
            b"/V1/chat/completions",
            b"/v1/./chat/completions",
            b"/v1/x/../chat/completions",
            b"*",
            b"http://x/v1/chat/completions",
            b"v1/chat/completions",
            b"/v1/chat/completions#f",
            b"/v1/chat/completions\xff",
            b"/%00",
        ]
    ),
)
NICE_QUERIES = st.sampled_from(
    [b"", b"", b"", b"?a=1&b=%20", b"?%zz", b"?", b"??", b"?a=1#frag", b"?a=/", b"?%C3%A9"]
)
QUERIES = mostly(
    NICE_QUERIES,
    st.one_of(
        st.binary(max_size=12).map(lambda q: b"?" + q),
        st.sampled_from([b"?x=\xc3\xa9", b"?a b", b"?\x00", b"?a=%"]),
    ),
)
NICE_NAMES = st.one_of(
    st.sampled_from(
        [
            b"x-hotseat-request-id",
            b"x-data-classification",
            b"accept",
            b"x-hotseat-backend",
            b"content-encoding",
            b"cookie",
            b"connection",
            b"keep-alive",
        ]
    ),
    st.text("abcxyz-_0189!#$%&'*+.^`|~", min_size=1, max_size=10).map(lambda n: b"x-" + n.encode()),
)
OBS_TEXT = [*range(0x21, 0x7F), *range(0x80, 0x100)]
NICE_HEADER_VALUES = mostly(
    st.text(st.characters(codec="utf-8", min_codepoint=0x21), max_size=20).map(str.encode),
    st.lists(st.sampled_from(OBS_TEXT), max_size=30).map(bytes),
)
"""UTF-8 text, or the printable ASCII and obs-text bytes HTTP/1.1 allows in a value."""
NAMES = mostly(
    st.sampled_from(
        [
            b"content-type",
            b"x-hotseat-request-id",
            b"connection",
            b"upgrade",
            b"expect",
            b"host",
            b"x-data-classification",
            b"accept",
            b"authorization",
            b"keep-alive",
            b"te",
            b"x-hotseat-backend",
            b"content-encoding",
            b"cookie",
        ]
    ),
    st.one_of(
        st.binary(min_size=1, max_size=10),
        st.text("abcxyz-_0189!#$%&'*+.^`|~", min_size=1, max_size=10).map(str.encode),
    ),
)
VALUES_H = mostly(
    st.sampled_from(
        [
            b"application/json",
            b"close",
            b"keep-alive",
            b"upgrade",
            b"content-type",
            b"x-data-classification",
            b"h2c",
            b"websocket",
            b"100-continue",
            b"x",
            b"",
            b"Bearer " + KEY.encode(),
            b"gzip",
            b"trailers",
            b"a, b, c",
            b"internal",
        ]
    ),
    st.one_of(st.binary(max_size=24), st.integers(100, 3000).map(lambda n: b"v" * n)),
)
FRAMING_HEADERS = st.sampled_from(
    [
        (b"content-length", b"5"),
        (b"content-length", b"+5"),
        (b"content-length", b"-1"),
        (b"content-length", b" 7 "),
        (b"content-length", b"0x10"),
        (b"content-length", b"1_0"),
        (b"content-length", b"99999999999999999999"),
        (b"transfer-encoding", b"chunked"),
        (b"transfer-encoding", b"gzip"),
        (b"transfer-encoding", b"chunked, chunked"),
        (b"transfer-encoding", b"identity"),
        (b"Content-Length", b"0"),
    ]
)
AUTH = st.sampled_from(
    [b"Bearer " + KEY.encode()] * 8
    + [
        b"Bearer",
        b"Bearer wrong",
        b"bearer " + KEY.encode(),
        b"Basic eA==",
        b"Bearer " + KEY.encode() + b" ",
        b"Bearer  " + KEY.encode(),
    ]
)


@dataclass(frozen=True)
class Request:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    framing: str
    """``length`` (a Content-Length), ``chunked``, or ``none`` (no body sent)."""
    chunks: list[int]
    body: Body
    version: bytes

    @property
    def clean(self) -> bool:
        """The body's extent is the one this test framed (no framing header of the
        fuzzer's own, no Expect or Upgrade that may change how it is read)."""
        names = {name.lower() for name, _ in self.headers}
        return self.version == b"HTTP/1.1" and not names & {
            b"content-length",
            b"transfer-encoding",
            b"expect",
            b"upgrade",
        }

    def encode(self) -> bytes:
        headers = list(self.headers)
        body = self.body.raw
        if self.framing == "length":
            headers.append((b"content-length", str(len(body)).encode()))
            payload = body
        elif self.framing == "chunked":
            headers.append((b"transfer-encoding", b"chunked"))
            payload = b""
            at = 0
            for size in [*self.chunks, len(body)]:
                piece = body[at : at + size]
                at += len(piece)
                if piece:
                    payload += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            payload += b"0\r\n\r\n"
        else:
            payload = b""
        lines = [self.method + b" " + self.target + b" " + self.version]
        lines += [name + b": " + value for name, value in headers]
        return b"\r\n".join(lines) + b"\r\n\r\n" + payload


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Half of them a well-formed chat request whose body is the fuzzed part, half of
    them fuzzed throughout (method, target, version, headers, framing)."""
    headers = [(b"host", b"router")]
    if draw(st.booleans()):
        headers.append((b"authorization", b"Bearer " + KEY.encode()))
        headers.append((b"content-type", b"application/json"))
        extra = draw(st.lists(st.tuples(NICE_NAMES, NICE_HEADER_VALUES), max_size=3))
        extra.append((b"x-fuzz", draw(NICE_HEADER_VALUES)))
        return Request(
            method=b"POST",
            target=draw(st.sampled_from(PROXY)) + draw(NICE_QUERIES),
            headers=draw(st.permutations(headers + extra)),
            framing=draw(st.sampled_from(["length"] * 4 + ["chunked"])),
            chunks=draw(st.lists(st.integers(1, 3000), max_size=4)),
            body=draw(BODIES),
            version=b"HTTP/1.1",
        )
    auth = draw(mostly(AUTH, st.none()))
    if auth is not None:
        headers.append((b"authorization", auth))
    if draw(st.booleans()):
        headers.append((b"content-type", b"application/json"))
    if draw(st.booleans()):
        headers += draw(st.lists(st.tuples(NAMES, VALUES_H), max_size=6))
    if draw(st.integers(0, 7)) == 0:
        headers.append(draw(FRAMING_HEADERS))
    return Request(
        method=draw(METHODS),
        target=draw(PATHS) + draw(QUERIES),
        headers=draw(st.permutations(headers)),
        framing=draw(st.sampled_from(["length"] * 6 + ["chunked", "none"])),
        chunks=draw(st.lists(st.integers(1, 3000), max_size=4)),
        body=draw(BODIES),
        version=draw(st.sampled_from([b"HTTP/1.1"] * 12 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.x"])),
    )


# ---- properties ---------------------------------------------------------------------


class TimeUp(BaseException):
    """Raised from an example once the budget is spent: hypothesis lets a BaseException
    through at once, which ends the run without a failure (none was found)."""


def strict_json(body: bytes) -> object:
    """The body as a strict reader sees it: UTF-8, no NaN/Infinity, no key twice."""

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in items]
        assert len(set(keys)) == len(keys), f"a key twice: {keys}"
        return dict(items)

    def constant(name: str) -> object:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(body.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)


def _connection_listed(request: Request) -> set[bytes]:
    return {
        token.strip().lower()
        for name, value in request.headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }


def check_forwarded(
    request: Request, answer: Answer, forwarded: bytes, target: str, headers: dict[str, str]
) -> None:
    backend = answer.header(b"x-hotseat-backend")
    document = strict_json(forwarded)
    assert isinstance(document, dict), document
    assert isinstance(document.get("model"), str), document
    assert document["model"], document
    path, _, query = target.encode("latin-1").partition(b"?")
    assert path in PROXY, target
    # The query string byte for byte; a byte not printable ASCII as its percent escape.
    sent_query = request.target.partition(b"#")[0].partition(b"?")[2]
    assert query == quote(sent_query, safe=string.punctuation).encode(), (target, request)
    fuzz = [v for k, v in request.headers if k == b"x-fuzz"]
    if fuzz and b"x-fuzz" not in _connection_listed(request):
        # An end-to-end header arrives with the bytes the client sent.
        assert headers.get("x-fuzz", "").encode("latin-1") == fuzz[0], (headers, fuzz)
    if backend == b"renames":
        assert document["model"] == SERVED_AS, document["model"]
    if request.clean and request.framing != "none":
        sent = request.body
        if backend == b"plain":
            assert forwarded == sent.raw
        elif sent.model_slot is not None:
            start, end = sent.model_slot
            assert forwarded == sent.raw[:start] + b'"served-m"' + sent.raw[end:]


def healthy(fuzz: RecordedRouter) -> None:
    assert fuzz.router.alive(), "the router process exited"
    conn = http.client.HTTPConnection(*fuzz.address, timeout=ANSWER_WAIT_S)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


@pytest.mark.timeout(FUZZ_SECONDS + 300)
def test_no_request_hurts_the_router_or_reaches_an_upstream_unread(
    recorded_router: RecordedRouter,
) -> None:
    """Random requests for ``HOTSEAT_FUZZ_SECONDS``: no 5xx, the router alive and answering
    /healthz after each, nothing at the upstream for an answer of the router's own, and
    every forwarded body the bytes the router read (only the model renamed)."""
    deadline = time.monotonic() + FUZZ_SECONDS
    tally: Counter[str] = Counter()
    failing = False

    @seed(FUZZ_SEED)
    @settings(
        max_examples=10**9,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def one(request: Request) -> None:
        nonlocal failing
        if not failing and time.monotonic() > deadline:
            raise TimeUp
        try:
            check_one(recorded_router, request, tally)
        except BaseException:
            failing = True
            raise

    started = time.monotonic()
    try:
        one()
    except TimeUp:
        pass
    finally:
        figures = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        print(
            f"\nfuzz: {tally['examples']} requests in {time.monotonic() - started:.0f}s: {figures}"
        )
    assert tally["examples"] > 0


def check_one(fuzz: RecordedRouter, request: Request, tally: Counter[str]) -> None:
    tally["examples"] += 1
    note(f"sent: {request.encode()!r}")
    before = fuzz.upstream.count()
    try:
        answer = exchange(
            fuzz.address,
            request.encode(),
            head_only=request.method == b"HEAD",
            timeout=ANSWER_WAIT_S,
        )
    except Silent:
        tally["no answer"] += 1
        answer = None
    reached = fuzz.upstream.since(before)
    healthy(fuzz)
    if answer is None:
        assert reached == [], "a request that got no answer reached the upstream"
        return
    tally[f"{answer.status} {_code(answer)}"] += 1
    assert answer.status < 500, answer
    if answer.header(b"x-hotseat-backend") is None:
        assert reached == [], f"answered {answer.status} by the router, yet forwarded"
        return
    tally["forwarded"] += 1
    assert len(reached) == 1, reached
    check_forwarded(request, answer, reached[0].body, reached[0].target, dict(reached[0].headers))


def _code(answer: Answer) -> str:
    """The OpenAI error code of an answer, for the tally."""
    try:
        return str(json.loads(answer.body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""
