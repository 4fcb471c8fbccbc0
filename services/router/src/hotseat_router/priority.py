"""A request's priority: its rule's, or, where the rule allows it, the one it asks for
with ``x-hotseat-priority`` (docs/adr/0006). A value above the rule's cap is lowered to
it; a malformed one is ignored (and counted); neither is an error."""

from __future__ import annotations

from dataclasses import dataclass

from hotseat_common.headers import PRIORITY
from hotseat_router.matching import Route

PRIORITY_B = PRIORITY.encode()
_MAX_DIGITS = 4


@dataclass(frozen=True, slots=True)
class Priority:
    value: int
    ignored: bool = False
    """The request sent a malformed ``x-hotseat-priority`` that its rule would have read."""


def request_priority(route: Route, headers: list[tuple[bytes, bytes]]) -> Priority:
    """The priority a request is held with: the rule's, unless the rule allows the header
    and the request sent a whole number there (then that, at most the rule's ``max``)."""
    if not route.priority_header.allow:
        return Priority(route.priority)
    sent = [value for name, value in headers if name.lower() == PRIORITY_B]
    if not sent:
        return Priority(route.priority)
    text = sent[-1].strip()
    if len(sent) > 1 or not text.isdigit() or len(text) > _MAX_DIGITS:
        return Priority(route.priority, ignored=True)
    return Priority(min(int(text), route.priority_header.max))
