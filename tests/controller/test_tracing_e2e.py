"""OpenTelemetry traces end to end (docs/adr/0010): real router, controller and sim
processes export over OTLP/HTTP to a receiver this test serves (it decodes the protocol's
protobuf, as a collector does). The request that causes a swap has one trace from the
router to the controller to the driver, every span of it about the swap carrying the swap's
id; a request served by the resident has no swap in its trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotseat_common import tracing as spans
from tests.controller.test_activation_e2e import chat, started
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]
SERVER, CLIENT = 2, 3
"""OTLP's span kinds."""


def _trace(receiver: OtlpReceiver, request_id: str) -> list[ReceivedSpan] | None:
    """The spans of the trace whose router request span is ``request_id``'s, once the
    request span is in (the router exports it last: it ends last)."""
    roots = [
        s
        for s in receiver.named(spans.REQUEST_SPAN)
        if s.attributes.get(spans.REQUEST_ID) == request_id
    ]
    if not roots:
        return None
    return [s for s in receiver.spans if s.trace_id == roots[0].trace_id]


def _one(found: list[ReceivedSpan], name: str, **attributes: Any) -> ReceivedSpan:
    matching = [
        s
        for s in found
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(matching) == 1, (name, attributes, found)
    return matching[0]


async def test_a_swap_is_one_trace_from_router_to_driver(make_stack: Make) -> None:
    """The request that causes coder's swap: router request span, its acquire span, the
    controller's acquire span (continued from the NATS headers), the swap span under it and
    the driver's unload of judge and load of coder under that, in one trace; the swap id on
    the swap, driver and router acquire spans is the one on the request's audit event."""
    async with otlp_receiver() as receiver:
        stack = make_stack(pool_stack_config(coder={"loadSeconds": 1}))
        stack.extra_env.update(
            {"HOTSEAT_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        )
        started(stack)
        await stack.wait_resident("judge")
        url = stack.routers[0].url
        caused = await chat(url, "coder", **{"x-hotseat-request-id": "traced-swap"})
        assert caused.status_code == 200, caused.text
        served = await chat(url, "coder", **{"x-hotseat-request-id": "traced-resident"})
        assert served.status_code == 200, served.text

        async def whole_trace() -> list[ReceivedSpan] | None:
            found = _trace(receiver, "traced-swap")
            names = {s.name for s in found or []}
            wanted = {spans.SWAP_SPAN, spans.DRIVER_LOAD_SPAN, spans.ACQUIRE_SPAN}
            return found if wanted <= names else None

        trace = await eventually(whole_trace, timeout=30, interval=0.1)
        resident = await eventually(lambda: _resolved(receiver, "traced-resident"), timeout=30)
    events = await stack.settled_audit()
    (event,) = [
        e for e in events if e.get("request_id") == "traced-swap" and e["kind"] == "request"
    ]
    swap_id = event["swap_id"]

    request = _one(trace, spans.REQUEST_SPAN)
    assert (request.service, request.kind, request.parent_id) == ("hotseat-router", SERVER, "")
    assert request.attributes[spans.SWAP_ID] == swap_id
    assert request.attributes[spans.OUTCOME] == "served"
    router_acquire = _one(trace, spans.ACQUIRE_SPAN, **{spans.POOL: "gpu0"})
    assert (router_acquire.service, router_acquire.kind) == ("hotseat-router", CLIENT)
    assert router_acquire.parent_id == request.span_id
    assert router_acquire.attributes[spans.SWAP_ID] == swap_id
    controller_acquires = [
        s for s in trace if s.name == spans.ACQUIRE_SPAN and s.service == "hotseat-controller"
    ]
    assert controller_acquires, trace
    assert all(s.parent_id == router_acquire.span_id for s in controller_acquires)
    assert all(s.kind == SERVER for s in controller_acquires)
    swap = _one(trace, spans.SWAP_SPAN)
    assert swap.attributes[spans.SWAP_ID] == swap_id
    assert swap.attributes[spans.RESULT] == "completed"
    assert swap.parent_id in {s.span_id for s in controller_acquires}
    unload = _one(trace, spans.DRIVER_UNLOAD_SPAN, **{spans.MEMBER: "judge"})
    load = _one(trace, spans.DRIVER_LOAD_SPAN, **{spans.MEMBER: "coder"})
    for driven in (unload, load):
        assert driven.parent_id == swap.span_id
        assert driven.attributes[spans.SWAP_ID] == swap_id
    assert {s.name for s in resident} == {spans.REQUEST_SPAN, spans.ACQUIRE_SPAN}
    assert all(spans.SWAP_ID not in s.attributes for s in resident)
    await stack.assert_invariants()


async def _resolved(receiver: OtlpReceiver, request_id: str) -> list[ReceivedSpan] | None:
    """The trace of ``request_id`` once it holds both its router spans and the
    controller's acquire span."""
    found = _trace(receiver, request_id) or []
    services = {(s.name, s.service) for s in found}
    wanted = {
        (spans.REQUEST_SPAN, "hotseat-router"),
        (spans.ACQUIRE_SPAN, "hotseat-router"),
        (spans.ACQUIRE_SPAN, "hotseat-controller"),
    }
    return found if wanted <= services else None
