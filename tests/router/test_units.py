"""Pure pieces of the router, without I/O: matching, passive health, API keys, errors."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from hotseat_common.config import parse_config
from hotseat_common.errors import IncumbentBusy
from hotseat_router.activation.protocol import Lease, LeaseLoss
from hotseat_router.auth import ApiKeyCheck
from hotseat_router.body import parse_body
from hotseat_router.errors import (
    BodyTooLarge,
    InvalidJson,
    InvalidRequest,
    error_answer,
    retry_after_seconds,
)
from hotseat_router.health import Admission, Failure, HealthPolicy, PassiveHealth
from hotseat_router.matching import Matcher
from hotseat_router.rewrite import locate_model, with_model


def test_first_matching_rule_wins_and_conditions_combine():
    """Rules are tried in order; a rule's model, header and classification conditions AND."""
    config = parse_config(
        {
            "backends": [{"name": n, "address": f"http://{n}:1"} for n in ("a", "b", "c")],
            "rules": [
                {
                    "name": "both",
                    "match": {"models": ["x*"], "headers": {"X-A": "1"}},
                    "route": {"backends": ["a"]},
                },
                {"name": "x", "match": {"models": ["x*"]}, "route": {"backends": ["b"]}},
                {
                    "name": "cls",
                    "match": {"dataClassification": ["PHI"]},
                    "route": {"backends": ["c"]},
                },
            ],
        }
    )
    matcher = Matcher(config)
    assert matcher.route("xy", {"x-a": "1"}).rule == "both"
    assert matcher.route("xy", {"x-a": "2"}).rule == "x"
    assert matcher.route("y", {"x-hotseat-classification": " phi "}).rule == "cls"
    assert matcher.route("y", {}) is None


def test_quarantine_then_single_trial():
    """A failed backend is refused until its quarantine ends, then admitted once as a trial."""
    now = [0.0]
    changes: list[tuple[str, bool]] = []
    health = PassiveHealth(
        HealthPolicy(10, failures=1, clients=1),
        clock=lambda: now[0],
        on_change=lambda b, h: changes.append((b, h)),
    )
    assert health.admit("a") is Admission.NORMAL
    health.failed("a", client="c1", kind=Failure.ANSWERED)
    assert health.admit("a") is None
    now[0] = 10.0
    assert health.admit("a") is Admission.TRIAL
    assert health.admit("a") is None
    health.abandoned("a", Admission.TRIAL)
    assert health.admit("a") is Admission.TRIAL
    health.succeeded("a")
    assert health.admit("a") is Admission.NORMAL
    assert changes == [("a", False), ("a", True)]


def test_quarantine_needs_failures_spread_over_clients_unless_unreachable():
    """Answers that fail (5xx, timeouts) quarantine only once `failures` requests from at
    least `clients` clients failed within the window with no success between; failures to
    connect need no second client; a success or the window's end forgets failures."""
    now = [0.0]
    health = PassiveHealth(
        HealthPolicy(10, failures=3, window_s=5, clients=2), clock=lambda: now[0]
    )
    for _ in range(5):
        health.failed("a", client="c1", kind=Failure.ANSWERED)
    assert not health.quarantined("a")
    health.failed("a", client="c2", kind=Failure.ANSWERED)
    assert health.quarantined("a")
    health.failed("b", client="c1", kind=Failure.ANSWERED)
    health.failed("b", client="c2", kind=Failure.ANSWERED)
    health.succeeded("b")
    health.failed("b", client="c1", kind=Failure.ANSWERED)
    assert not health.quarantined("b")
    for _ in range(2):
        health.failed("u", client="c1", kind=Failure.UNREACHABLE)
    now[0] = 5.0  # the first two fall out of the window
    health.failed("u", client="c1", kind=Failure.UNREACHABLE)
    assert not health.quarantined("u")
    health.failed("u", client="c1", kind=Failure.UNREACHABLE)
    health.failed("u", client="c1", kind=Failure.UNREACHABLE)
    assert health.quarantined("u")


def test_api_keys_constant_time_check():
    """Only a configured Bearer key passes; no keys means no check."""
    check = ApiKeyCheck(["k1", "k2"])
    assert check.allows(b"Bearer k2")
    assert check.allows(b"bearer k1")
    assert not check.allows(b"Bearer k3")
    assert not check.allows(b"k1")
    assert not check.allows(None)
    assert ApiKeyCheck([]).allows(None)


def test_body_parsing_and_rewrite():
    """Only model and stream are read; a rewrite changes only the model's bytes."""
    body = b'{"model": "a", "stream": true, "n": 1}'
    fields = parse_body(body)
    assert (fields.model, fields.stream) == ("a", True)
    assert parse_body(b'{"model": "a", "stream": "yes"}').stream is False
    renamed = b"".join(with_model(body, locate_model(body), "b"))
    assert renamed == b'{"model": "b", "stream": true, "n": 1}'
    with pytest.raises(InvalidJson):
        parse_body(b"\xff")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"model":"a"}', b'"a"'),
        (b'{ "x" : {"model": "no"}, "model" :\n"a\\"" }', b'"a\\""'),
        ('{"\u00e9": "\u00fc", "mod\\u0065l": "\u00e9a"}'.encode(), '"\u00e9a"'.encode()),
    ],
)
def test_the_model_slot_is_the_top_level_value(body: bytes, where: bytes):
    """The slot is the bytes of the top-level model value, whatever comes before it."""
    slot = locate_model(body)
    assert body[slot.start : slot.end] == where


def test_depth_and_duplicate_keys():
    """Depth counts every array and object level; a key twice in any object is refused,
    however it is spelled, while equal keys in different objects are fine."""
    assert parse_body(b'{"model": "a", "x": [[]]}', max_depth=3).model == "a"
    with pytest.raises(InvalidRequest, match="deeper than 2"):
        parse_body(b'{"model": "a", "x": [[]]}', max_depth=2)
    assert parse_body(b'{"model": "a", "x": [{"k": "\\\\"}, {"k": "\\""}]}').model == "a"
    for twice in (b'{"model": "a", "x": {"k": 1, "\\u006b": 2}}', b'{"model": "a", "model": "a"}'):
        with pytest.raises(InvalidRequest, match="duplicate key"):
            parse_body(twice)


def test_error_answers():
    """Codes map to status, OpenAI body and whole-second Retry-After where due."""
    status, headers, body = error_answer(IncumbentBusy("busy", retry_after=1.2))
    assert status == 503
    assert (b"retry-after", b"2") in headers
    assert b'"code":"pool_incumbent_busy"' in body
    status, headers, _ = error_answer(BodyTooLarge("big"))
    assert status == 413
    assert not any(name == b"retry-after" for name, _ in headers)
    assert retry_after_seconds(None) == 1
    assert retry_after_seconds(0.01) == 1


async def test_a_lease_loss_tells_its_watchers_in_order_once():
    """Each request sharing a lease registers a callback; those still registered when the
    lease is lost are called once, in the order they came; one that ended (unwatched) is
    not; one registered after the loss is called at once; a waiter that gave up is gone."""
    loss = LeaseLoss()
    called: list[str] = []
    callbacks = {name: (lambda name=name: called.append(name)) for name in "abcd"}
    for name in "abcd":
        loss.watch(callbacks[name])
    loss.unwatch(callbacks["b"])
    loss.unwatch(callbacks["b"])  # twice: nothing
    assert loss.watching == 3
    gave_up = asyncio.ensure_future(loss.wait())
    await asyncio.sleep(0)
    gave_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gave_up
    assert loss.waiting == 0
    waiting = asyncio.ensure_future(loss.wait())
    await asyncio.sleep(0)
    assert loss.waiting == 1
    loss.set()
    loss.set()
    await asyncio.wait_for(waiting, 1)
    assert called == ["a", "c", "d"]
    assert loss.watching == 0
    loss.watch(lambda: called.append("late"))
    assert called == ["a", "c", "d", "late"]


def test_a_lease_handle_is_the_lease_naming_its_own_swap():
    """A shared request's handle is built field by field: it must equal what
    ``dataclasses.replace`` would build, every field the lease has included (a field
    added to :class:`Lease` and not to ``handle`` fails here), sharing the lease's loss."""
    lease = Lease(
        "gpu0",
        "a",
        "lease-1",
        7,
        6.0,
        attempt="r-1",
        request_id="req-1",
        swap_id="swap-1",
        valid_until=123.5,
        group="g",
    )
    values = {f.name: getattr(lease, f.name) for f in dataclasses.fields(Lease)}
    assert len(set(map(repr, values.values()))) == len(values)  # every field tells apart
    for swap_id in ("swap-2", None):
        handle = lease.handle(swap_id=swap_id)
        assert handle == dataclasses.replace(lease, swap_id=swap_id)
        assert handle is not lease
        assert handle.lost is lease.lost
