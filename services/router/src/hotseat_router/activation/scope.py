"""One request's ownership of its lease: opened when the lease is granted, closed exactly
once when the request is done with it (the response body ended, the client left, or the
walk moved on to another backend). The dispatch walk opens it and hands it, with the
response, to the relay, which closes it from its ``finally``."""

from __future__ import annotations

from hotseat_router.activation.protocol import ActivationClient, Lease


class LeaseScope:
    def __init__(self, activation: ActivationClient, lease: Lease, request_id: str) -> None:
        self._activation = activation
        self.lease = lease
        self._request_id = request_id
        self._closed = False

    async def close(self, *, confirm: bool = False) -> None:
        """Give the lease back (once; later calls do nothing). ``confirm``: return only once
        the controller has it, so a next acquire of the same request never finds it."""
        if self._closed:
            return
        self._closed = True
        await self._activation.release(self.lease, confirm=confirm)

    async def report_failure(self, reason: str) -> None:
        """The member failed at the connection level: the controller checks it."""
        await self._activation.report_failure(
            self.lease, request_id=self._request_id, reason=reason
        )
