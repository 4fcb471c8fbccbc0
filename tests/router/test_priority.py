"""A request's priority as the router sends it with its acquire (docs/adr/0006): the
rule's, or the ``x-hotseat-priority`` header where the rule allows it (clamped to the
rule's cap; malformed: ignored and counted); and how long it was held, in
``x-hotseat-hold-ms``."""

from __future__ import annotations

import re

import pytest

from hotseat_common.config.model import PoolActivation, PriorityHeader
from hotseat_router.matching import Route
from hotseat_router.priority import request_priority
from tests.router.fake_activation import FakeActivation

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": []}


def route(priority: int = 0, *, allow: bool = False, cap: int = 10) -> Route:
    return Route(
        rule="r",
        backends=(),
        activation=PoolActivation.WAIT,
        timeout=None,
        priority=priority,
        priority_header=PriorityHeader(allow=allow, max=cap),
    )


@pytest.mark.parametrize(
    ("headers", "allow", "expected"),
    [
        ([], True, (3, False)),
        ([(b"x-hotseat-priority", b"7")], True, (7, False)),
        ([(b"X-Hotseat-Priority", b" 9 ")], True, (9, False)),
        ([(b"x-hotseat-priority", b"50")], True, (10, False)),  # clamped to the cap
        ([(b"x-hotseat-priority", b"0")], True, (0, False)),  # may lower it too
        ([(b"x-hotseat-priority", b"high")], True, (3, True)),
        ([(b"x-hotseat-priority", b"-1")], True, (3, True)),
        ([(b"x-hotseat-priority", b"1.5")], True, (3, True)),
        ([(b"x-hotseat-priority", b"99999999999")], True, (3, True)),
        ([(b"x-hotseat-priority", b"1"), (b"x-hotseat-priority", b"2")], True, (3, True)),
        ([(b"x-hotseat-priority", b"7")], False, (3, False)),  # not allowed: not read
        ([(b"x-hotseat-priority", b"high")], False, (3, False)),
    ],
)
def test_the_priority_a_request_is_held_with(headers, allow, expected) -> None:
    """Rule priority 3, header cap 10: what each header value gives."""
    found = request_priority(route(3, allow=allow), headers)
    assert (found.value, found.ignored) == expected


@pytest.fixture
async def pooled(upstream, start_router):
    """Rule "low" (priority 1, header allowed up to 5) and rule "fixed" (priority 4, no
    header), both to pooled member gpu0/a."""
    a = await upstream("a")
    activation = FakeActivation()
    config = {
        "backends": [{"name": "a", "address": a.url, "pool": {"name": "gpu0", "member": "a"}}],
        "pools": [{"name": "gpu0", "members": [{"name": "a"}, {"name": "b"}]}],
        "rules": [
            {
                "name": "low",
                "match": {"models": ["m"]},
                "route": {"backends": ["a"]},
                "priority": 1,
                "priorityHeader": {"allow": True, "max": 5},
            },
            {
                "name": "fixed",
                "match": {"models": ["f"]},
                "route": {"backends": ["a"]},
                "priority": 4,
            },
        ],
    }
    router = await start_router(config, activation_factory=activation.factory)
    return router, activation


def ignored(metrics: str, rule: str) -> float:
    pattern = (
        rf'^hotseat_router_priority_header_ignored_total\{{[^}}]*rule="{rule}"[^}}]*\}} (\S+)$'
    )
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_the_acquire_carries_the_priority_and_the_response_the_hold(pooled, client) -> None:
    """The acquire is sent with the rule's priority, the allowed header's (clamped), or the
    rule's when the header is malformed (counted) or not allowed; every pooled response
    says how long it was held."""
    router, activation = pooled
    sent = [
        ({"model": "m"}, {}),
        ({"model": "m"}, {"x-hotseat-priority": "3"}),
        ({"model": "m"}, {"x-hotseat-priority": "42"}),
        ({"model": "m"}, {"x-hotseat-priority": "urgent"}),
        ({"model": "f"}, {"x-hotseat-priority": "0"}),
    ]
    for body, headers in sent:
        response = await client.post(router.url + CHAT, json={**BODY, **body}, headers=headers)
        assert response.status_code == 200, response.text
        assert int(response.headers["x-hotseat-hold-ms"]) >= 0
    assert [a.priority for a in activation.acquires] == [1, 3, 5, 1, 4]
    metrics = (await client.get(router.url + "/metrics")).text
    assert ignored(metrics, "low") == 1
    assert ignored(metrics, "fixed") == 0
