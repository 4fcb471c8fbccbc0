"""Header names that cross process boundaries: HTTP (the controller's drivers to backends)
and NATS (the controller's error replies)."""

from __future__ import annotations

EPOCH = "x-hotseat-epoch"
"""Sent by the ``http`` driver with every load and unload: the swap's fencing epoch. A
backend that remembers the highest epoch it obeyed and refuses a lower one (HTTP 409)
fences a controller that lost the swap (docs/drivers.md)."""

PRIORITY = "x-hotseat-priority"
"""A request's own priority, read by the router when its rule allows it (a whole number;
above the rule's ``priorityHeader.max`` it is lowered to it, malformed it is ignored)."""

SESSION = "x-hotseat-session"
"""A conversation's id: a model group places its turns on the pool that served the last one
when that costs no wait (else the OpenAI ``user`` field is the conversation; docs/adr/0012)."""

PLACEMENT = "x-hotseat-placement"
"""On a model group's response: the pool it was placed on and why
(``gpu2; reason=resident_least_busy``)."""

SERVICE_ERROR = "Nats-Service-Error"
SERVICE_ERROR_CODE = "Nats-Service-Error-Code"


def service_error(description: str, status: int) -> dict[str, str]:
    """The NATS service error headers (the ``nats.micro`` convention) of an error reply:
    a short description and an HTTP-like status."""
    return {SERVICE_ERROR: description, SERVICE_ERROR_CODE: str(status)}
