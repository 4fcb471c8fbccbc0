"""compose.yaml's stack as a user meets it: requests through nginx and the OpenAI SDK, an
IfIdle fall-through while the other member streams, ``hotseat status`` against the
controllers, ``hotseat audit query`` and the audit trail in PostgreSQL, and one image
behind every Hotseat service."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import docker
import httpx
import psycopg
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk

from hotseat.launcher import find_binary
from tests.deploy.compose.conftest import Stack

pytestmark = pytest.mark.timeout(300)

HELLO = [{"role": "user", "content": "Hello!"}]
HOTSEAT_SERVICES = {
    "sim-assistant": "hotseat-sim",
    "sim-coder": "hotseat-sim",
    "controller-1": "hotseat-controller",
    "controller-2": "hotseat-controller",
    "audit": "hotseat-audit",
    "router-1": "hotseat-router",
    "router-2": "hotseat-router",
}
"""Each Hotseat service of compose.yaml and the entry point it runs."""


def sdk(stack: Stack) -> OpenAI:
    # The SDK's own default timeout (600 s) covers a swap; no retries, so a failure shows.
    return OpenAI(base_url=f"{stack.gateway}/v1", api_key="none", max_retries=0)


def chat(stack: Stack, model: str, request_id: str) -> dict[str, Any]:
    """A short chat completion through the gateway with curl's view: plain HTTP."""
    response = httpx.post(
        f"{stack.gateway}/v1/chat/completions",
        json={"model": model, "messages": HELLO, "max_tokens": 4},
        headers={"x-hotseat-request-id": request_id},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-request-id"] == request_id
    body: dict[str, Any] = response.json()
    return body


def is_served(event: dict[str, Any]) -> bool:
    return bool(event["kind"] == "request" and event["outcome"] == "served")


def served(events: list[dict[str, Any]]) -> bool:
    return any(is_served(e) for e in events)


def test_both_routers_answer_through_the_gateway(stack: Stack, request_id: str) -> None:
    """Four requests to nginx's one port are served by both router replicas."""
    ids = [f"{request_id}-{n}" for n in range(4)]
    for rid in ids:
        assert chat(stack, "assistant", rid)["choices"][0]["message"]["content"]
    # A request's events include the swap it caused (pool events, carrying its request id).
    routers = {
        e["router"]
        for rid in ids
        for e in stack.wait_for_events(served, request_id=rid)
        if is_served(e)
    }
    assert routers == set(stack.routers), routers


def test_chat_through_the_openai_sdk(stack: Stack) -> None:
    """The OpenAI SDK gets a chat completion from the coder member through the gateway."""
    completion = sdk(stack).chat.completions.create(model="coder", messages=HELLO, max_tokens=8)
    assert completion.model == "qwen2.5-coder-32b"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 8


def test_stream_through_the_openai_sdk(stack: Stack) -> None:
    """The OpenAI SDK streams a completion chunk by chunk through nginx to its end."""
    stream = sdk(stack).chat.completions.create(
        model="assistant",
        messages=HELLO,
        max_tokens=12,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 12
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason == "length"


def test_ifidle_falls_through_while_the_other_member_streams(stack: Stack, request_id: str) -> None:
    """While coder streams, a request for `assistant` (IfIdle) does not wait for a swap:
    it skips the busy pool's assistant and is served by coder, the rule's next backend."""
    client = sdk(stack)
    started = threading.Event()
    chunks: list[ChatCompletionChunk] = []

    def stream_coder() -> None:
        with client.chat.completions.create(
            model="coder",
            messages=HELLO,
            max_tokens=200,  # 10 s at the sim's 20 tokens per second
            stream=True,
        ) as stream:
            for chunk in stream:
                chunks.append(chunk)
                started.set()

    streamer = threading.Thread(target=stream_coder)
    streamer.start()
    while not started.wait(0.1):
        assert streamer.is_alive(), "the coder stream ended before its first chunk"
    raw = client.chat.completions.with_raw_response.create(
        model="assistant",
        messages=HELLO,
        max_tokens=4,
        extra_headers={"x-hotseat-request-id": request_id},
    )
    streamer.join()
    assert raw.headers["x-hotseat-backend"] == "coder"
    assert raw.parse().choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    events = stack.wait_for_events(
        lambda es: served(es) and any(e["outcome"] == "busy_skip" for e in es),
        request_id=request_id,
    )
    skip = next(e for e in events if e["outcome"] == "busy_skip")
    answer = next(e for e in events if e["outcome"] == "served")
    assert (skip["backend"], skip["member"], skip["rule"]) == (
        "assistant",
        "assistant",
        "assistant-prefers-small",
    )
    assert (answer["backend"], answer["member"]) == ("coder", "coder")


def test_hotseat_status_against_both_controllers(stack: Stack) -> None:
    """`hotseat status` prints pool gpu0 with a resident member, the same one whichever
    controller replica is asked (their state is in the one Redis)."""
    residents = set()
    for url in stack.controllers.values():
        out = subprocess.run(
            [find_binary("hotseat"), "status", "--url", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        header, *rows = out.splitlines()
        assert header.split()[:3] == ["POOL", "RESIDENT", "PHASE"]
        (row,) = [r.split() for r in rows if r.startswith("gpu0 ")]
        residents.add(row[1])
    assert len(residents) == 1
    assert residents <= {"assistant", "coder"}


def test_audit_query_reads_the_trail_from_postgresql(stack: Stack, request_id: str) -> None:
    """A request's outcome is stored in PostgreSQL, and `hotseat audit query` finds it."""
    chat(stack, "coder", request_id)
    stack.wait_for_events(served, request_id=request_id)
    out = subprocess.run(
        [find_binary("hotseat"), "audit", "query", "--url", stack.audit, "--json",
         "--request-id", request_id],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    (event,) = [json.loads(line) for line in out.splitlines()]
    assert (event["outcome"], event["backend"], event["request_id"]) == (
        "served",
        "coder",
        request_id,
    )
    with psycopg.connect(stack.postgres) as db:
        rows = db.execute(
            "SELECT kind, outcome, backend, router FROM audit_events WHERE request_id = %s",
            (request_id,),
        ).fetchall()
    assert rows == [("request", "served", "coder", event["router"])]


def test_one_image_runs_every_hotseat_service(stack: Stack) -> None:
    """Routers, controllers, audit and sims all run the one Hotseat image, each its own
    entry point, and every container of the stack is on the host's network."""
    client = docker.from_env()
    try:
        containers = client.containers.list(
            filters={"label": f"com.docker.compose.project={stack.project}"}
        )
    finally:
        client.close()
    by_service = {c.labels["com.docker.compose.service"]: c.attrs for c in containers}
    assert set(HOTSEAT_SERVICES) <= set(by_service)
    commands = {s: by_service[s]["Config"]["Cmd"][0] for s in HOTSEAT_SERVICES}
    assert commands == HOTSEAT_SERVICES
    assert {by_service[s]["Config"]["Image"] for s in HOTSEAT_SERVICES} == {stack.image}
    assert len({by_service[s]["Image"] for s in HOTSEAT_SERVICES}) == 1  # one image id
    assert {c["HostConfig"]["NetworkMode"] for c in by_service.values()} == {"host"}
