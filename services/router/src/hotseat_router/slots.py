"""Who gives way when a router process has no connection slot left.

A process serves at most ``--max-connections`` connections at once. When one more
arrives, refusing it (503) protects the connections already open, and lets one client
that holds every slot lock every other client out; closing whichever connection is idle
lets an attacker's stream of new connections push established clients out. Neither is
fair. So the slots are shared by peer address:

- the peer holding the most open connections gives way: its connection that has waited
  longest for a request's head (one that has sent nothing since it opened or since its
  last response, or is still trickling its head) is closed to make room. HTTP lets a
  server close such a connection at any time;
- unless the newcomer's own peer holds as many: it already has its share, and the
  newcomer is refused (503), as it is when the holder has no such connection (every
  one of them has a request under way).

Behind a load balancer every connection has the balancer's address, so a newcomer is
refused when the slots are full, as before; facing clients directly, one client can no
longer hold the slots the others need (docs/adr/0013-connection-slots.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Generic, TypeVar

Conn = TypeVar("Conn")


class ConnectionSlots(Generic[Conn]):
    """The open connections of one server by peer address, and which of them are
    *unclaimed*: no request of theirs has its head complete, the longest waiting first."""

    __slots__ = ("_open", "_unclaimed")

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()
        self._unclaimed: dict[str, dict[Conn, None]] = {}

    def opened(self, peer: str) -> None:
        self._open[peer] += 1

    def closed(self, connection: Conn, peer: str) -> None:
        self.claimed(connection, peer)
        self._open[peer] -= 1
        if self._open[peer] <= 0:
            del self._open[peer]

    def unclaimed(self, connection: Conn, peer: str) -> None:
        """``connection`` waits for a request's head from now on (it opened, or its last
        response is complete and it is kept alive)."""
        waiting = self._unclaimed.setdefault(peer, {})
        waiting.pop(connection, None)
        waiting[connection] = None

    def claimed(self, connection: Conn, peer: str) -> None:
        """A request's head on ``connection`` is complete (or it is closing)."""
        waiting = self._unclaimed.get(peer)
        if waiting is not None:
            waiting.pop(connection, None)
            if not waiting:
                del self._unclaimed[peer]

    def give_way(self, newcomer_peer: str) -> Conn | None:
        """The connection to close so that a newcomer of ``newcomer_peer`` (already
        counted open) may stay, taken out of the unclaimed ones; ``None``: refuse the
        newcomer."""
        holder, most = max(self._open.items(), key=lambda item: item[1])
        if self._open[newcomer_peer] >= most:
            return None  # the newcomer's peer holds its share already
        waiting = self._unclaimed.get(holder)
        if not waiting:
            return None
        connection = next(iter(waiting))
        self.claimed(connection, holder)
        return connection

    def open_count(self, peer: str) -> int:
        return self._open[peer]
