"""The ASGI types the router's hot path uses (it speaks raw ASGI, not a web framework),
and the one scope extension the router's own HTTP server adds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CLIENT_LEFT = "hotseat.client_left"
"""A request scope's ``extensions`` key by which its connection tells it, with no task,
that the client left. The router's connection layer (``hotseat_router.connection``)
sets it; under any other ASGI server it is absent and a request learns that its client
left by awaiting ``receive()`` until ``http.disconnect``, which costs a task per request.

Its value (an ASGI extension is a dict) holds two callables:

- ``watch(callback)``: call ``callback()`` once if the connection is lost before this
  request's response is complete (at once if it is already lost). One request at a time:
  a later ``watch`` replaces an earlier one, and the registration ends by itself when the
  response is complete, so it never fires for a later request on the connection.
- ``unwatch(callback)``: undo ``watch(callback)`` (a callback equal to it); nothing when
  another callback was registered since.
"""

OnClientLeft = Callable[[], None]
ClientLeftHook = Callable[[OnClientLeft], None]
"""``watch`` and ``unwatch`` of ``CLIENT_LEFT``."""
