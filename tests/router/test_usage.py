"""Token usage: read from the upstream's ``usage`` as the body goes by (plain JSON, and the
last chunk of a stream that asked ``include_usage``), counted per rule, backend and API key
(``hotseat_router_tokens_total``) and put on the request's audit event; the optional access
log writes one line per request with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml

from hotseat.launcher import Managed, free_port, start_service
from hotseat_common.config import parse_config
from hotseat_router.usage import WINDOW, UsageMeter, find_usage
from tests.router.conftest import AuditReader
from tests.support.sim import run_sim
from tests.support.waiting import eventually

KEYS = ("key-alice", "key-bob")

# --- the meter ---------------------------------------------------------------------------


def _meter(*chunks: bytes) -> UsageMeter:
    meter = UsageMeter()
    for chunk in chunks:
        meter.feed(chunk)
    return meter


def test_a_json_body_s_usage_is_read_from_its_end() -> None:
    """A chat answer with its usage last (nested details included) gives both counts; an
    embeddings answer (no completion tokens) gives zero completion tokens."""
    chat = {
        "choices": [{"message": {"content": 'a "usage": {"prompt_tokens": 99} in text'}}],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 3},
        },
    }
    usage = _meter(orjson.dumps(chat)).usage()
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (12, 5)
    embeddings = {"data": [{"embedding": [0.1] * 10}], "usage": {"prompt_tokens": 7}}
    usage = _meter(orjson.dumps(embeddings)).usage()
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 0)


def test_a_stream_s_last_usage_counts_even_split_across_chunks() -> None:
    """Events that say ``"usage": null`` are passed over; the last event's usage counts,
    though its bytes arrive in three chunks."""
    events = [b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'] * 50
    last = b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9}}\n\n'
    usage = _meter(*events, last[:20], last[20:45], last[45:], b"data: [DONE]\n\n").usage()
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (40, 9)


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices": []}',
        b'{"usage": null}',
        b'{"usage": {"prompt_tokens": "12", "completion_tokens": 1}}',
        b'{"usage": {"prompt_tokens": -1, "completion_tokens": 1}}',
        b'{"usage": {"prompt_tokens": 3, "completion_tokens": 1',
        b"data: [DONE]\n\n",
    ],
)
def test_no_usage_or_a_malformed_one_counts_nothing(body: bytes) -> None:
    """No usage, a null, non-integer, negative or cut-off one: unknown, not zero."""
    assert find_usage(body) is None


def test_a_usage_further_from_the_end_than_the_window_is_not_kept() -> None:
    """Only the body's last bytes are kept: a usage followed by more than the window is
    not found (the meter holds no more than a window and a chunk)."""
    head = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "data": "'
    meter = _meter(head, *([b"x" * 1000] * (WINDOW // 1000 + 2)), b'"}')
    assert meter.usage() is None
    assert meter._size < WINDOW + 1000


# --- through the router -------------------------------------------------------------------


def _config() -> dict[str, Any]:
    return {
        "backends": [
            {"name": "small", "address": f"http://127.0.0.1:{free_port()}"},
            {"name": "big", "address": f"http://127.0.0.1:{free_port()}"},
        ],
        "rules": [
            {"name": "chat", "match": {"models": ["assistant"]}, "route": {"backends": ["small"]}},
            {"name": "embed", "match": {"models": ["embedder"]}, "route": {"backends": ["big"]}},
        ],
    }


async def _requests(url: str) -> dict[str, tuple[int, int] | None]:
    """Four answers through the router, each with the usage its client saw: a plain chat
    (alice), a stream asking for usage (bob), a stream not asking (alice), embeddings (bob)."""
    seen: dict[str, tuple[int, int] | None] = {}
    clients = {k: openai.AsyncOpenAI(base_url=url + "/v1", api_key=k, max_retries=0) for k in KEYS}
    alice, bob = clients[KEYS[0]], clients[KEYS[1]]
    message = [{"role": "user", "content": "count my tokens please"}]
    plain = await alice.chat.completions.create(
        model="assistant", messages=message, max_tokens=5,  # type: ignore[arg-type]
        extra_headers={"x-hotseat-request-id": "plain"},
    )  # fmt: skip
    assert plain.usage is not None
    seen["plain"] = (plain.usage.prompt_tokens, plain.usage.completion_tokens)
    stream = await bob.chat.completions.create(
        model="assistant", messages=message, max_tokens=7, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_headers={"x-hotseat-request-id": "streamed"},
    )  # fmt: skip
    chunks = [c async for c in stream]
    last = chunks[-1].usage
    assert last is not None
    seen["streamed"] = (last.prompt_tokens, last.completion_tokens)
    quiet = await alice.chat.completions.create(
        model="assistant", messages=message, max_tokens=3, stream=True,  # type: ignore[arg-type]
        extra_headers={"x-hotseat-request-id": "quiet"},
    )  # fmt: skip
    assert all(c.usage is None for c in [c async for c in quiet])
    seen["quiet"] = None
    embedded = await bob.embeddings.create(
        model="embedder", input="embed me", extra_headers={"x-hotseat-request-id": "embedded"}
    )
    seen["embedded"] = (embedded.usage.prompt_tokens, 0)
    for client in clients.values():
        await client.close()
    return seen


async def _metric(url: str) -> dict[tuple[str, ...], float]:
    """``hotseat_router_tokens_total`` by (rule, backend, api_key, type)."""
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(url + "/metrics")).text
    found: dict[tuple[str, ...], float] = {}
    for line in text.splitlines():
        if line.startswith("hotseat_router_tokens_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = tuple(labels[n].strip('"') for n in ("rule", "backend", "api_key", "type"))
            found[key] = float(line.rsplit(" ", 1)[1])
    return found


async def test_usage_is_counted_per_rule_backend_and_key_and_audited(
    redis_server: Managed, prefix: str, start_router: Any, audit: AuditReader
) -> None:
    """What each client was told its usage was is what the router counts, by rule, backend
    and key digest, and what each request event carries; a stream that did not ask for
    usage counts nothing and its event carries none."""
    config = parse_config(_config())
    async with (
        run_sim(config, "small", redis_url=redis_server.url, key_prefix=prefix, loaded=True),
        run_sim(config, "big", redis_url=redis_server.url, key_prefix=prefix, loaded=True),
    ):
        router = await start_router(config, api_keys=",".join(KEYS))
        seen = await _requests(router.url)
        events = {rid: await audit.request_event(rid) for rid in seen}
        metric = await _metric(router.url)
    digests = {rid: events[rid]["api_key"] for rid in seen}
    assert digests["plain"] == digests["quiet"] != digests["streamed"] == digests["embedded"]
    assert all(len(d) == 16 and d not in KEYS for d in digests.values())
    for rid, usage in seen.items():
        counted = (events[rid].get("prompt_tokens"), events[rid].get("completion_tokens"))
        assert counted == (usage or (None, None)), rid
    alice, bob = digests["plain"], digests["streamed"]
    assert seen["plain"] is not None
    assert seen["streamed"] is not None
    assert seen["embedded"] is not None
    expected = {
        ("chat", "small", alice, "prompt"): seen["plain"][0],
        ("chat", "small", alice, "completion"): seen["plain"][1],
        ("chat", "small", bob, "prompt"): seen["streamed"][0],
        ("chat", "small", bob, "completion"): seen["streamed"][1],
        ("embed", "big", bob, "prompt"): seen["embedded"][0],
        ("embed", "big", bob, "completion"): 0,
    }
    assert metric == expected


async def _access_lines(router: Managed, count: int) -> list[dict[str, Any]]:
    """The router's ``access`` log lines, once there are ``count`` of them."""
    records = [orjson.loads(line) for line in router.log_text().splitlines() if line[:1] == "{"]
    lines = [r for r in records if r.get("event") == "access"]
    return lines if len(lines) >= count else []


async def test_the_access_log_writes_one_line_per_request(
    redis_server: Managed, nats_server: Managed, prefix: str, tmp_path: Path
) -> None:
    """``HOTSEAT_ACCESS_LOG=true``: one ``access`` line per request (served or refused),
    with its outcome, status, rule, backend and usage; off by default: none."""
    raw = _config()
    config = parse_config(raw)
    path = tmp_path / "hotseat.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {
        "HOTSEAT_CONFIG": str(path),
        "HOTSEAT_NATS_URL": nats_server.url,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"{prefix}_AUDIT",
        "HOTSEAT_LOG_FORMAT": "json",
    }
    async with run_sim(config, "small", redis_url=redis_server.url, key_prefix=prefix, loaded=True):
        on = {**env, "HOTSEAT_ACCESS_LOG": "true"}
        logged = start_service(
            "router-access", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=on
        )
        quiet = start_service(
            "router-quiet", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=env
        )
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                for router in (logged, quiet):
                    body = {"model": "assistant", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                    served = await http.post(router.url + "/v1/chat/completions", json=body)
                    assert served.status_code == 200, served.text
                    unknown = await http.post(
                        router.url + "/v1/chat/completions", json={**body, "model": "nobody"}
                    )
                    assert unknown.status_code == 404
            lines = await eventually(lambda: _access_lines(logged, 2), timeout=10)
        finally:
            logged.stop()
            quiet.stop()
    served_line, refused_line = sorted(lines, key=lambda line: line["outcome"] != "served")
    usage = served.json()["usage"]
    assert (served_line["status"], served_line["rule"], served_line["backend"]) == (
        200,
        "chat",
        "small",
    )
    assert served_line["prompt_tokens"] == usage["prompt_tokens"]
    assert served_line["completion_tokens"] == usage["completion_tokens"]
    assert served_line["logger"] == "hotseat.access"
    assert (refused_line["outcome"], refused_line["status"]) == ("no_route", 404)
    assert len(lines) == 2
    assert await _access_lines(quiet, 1) == []  # stopped: its whole log is written
