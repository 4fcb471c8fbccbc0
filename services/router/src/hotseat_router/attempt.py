"""One try of one backend: admitted by passive health, leased if the backend is a pool
member, and settled once. Its health verdict is given exactly once (served, failed, or
abandoned without a verdict), and its lease is either handed on with the response or
released when the try ends."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from hotseat_common.config.model import Backend
from hotseat_router.activation.protocol import new_attempt
from hotseat_router.activation.scope import LeaseScope
from hotseat_router.health import Admission, Failure, PassiveHealth


class Attempt:
    """As an async context manager: a try that ends without a verdict is abandoned (the
    client left, the deadline passed, the pool said no), and a lease that was not handed
    on is released; confirmed when the try ended normally, because the walk then goes on,
    maybe to another member of the same pool, whose acquire must not find this request's
    own lease still live (it would be skipped as busy because of itself)."""

    def __init__(
        self,
        backend: Backend,
        admission: Admission,
        health: PassiveHealth,
        *,
        router: str,
        client: str,
        id: str | None = None,  # noqa: A002 - the attempt's name, as the controller has it
    ) -> None:
        self.id = id or new_attempt(router)
        """This try's name at the pool controller (the key of its waiter and its lease)."""
        self.backend = backend
        self._admission = admission
        self._health = health
        self._client = client
        self.lease: LeaseScope | None = None
        self._settled = False
        self._handed_on = False

    @classmethod
    def admitted(
        cls,
        backend: Backend,
        health: PassiveHealth,
        *,
        router: str,
        client: str,
        id: str | None = None,  # noqa: A002 - the attempt's name, as the controller has it
    ) -> Attempt | None:
        """A try of ``backend`` for a request of ``client`` if passive health lets one go
        to it now (``None``: it is quarantined, or its one trial request is already out)."""
        admission = health.admit(backend.name)
        if admission is None:
            return None
        return cls(backend, admission, health, router=router, client=client, id=id)

    def succeeded(self) -> None:
        if self._settle():
            self._health.succeeded(self.backend.name)

    def failed(self, kind: Failure) -> None:
        if self._settle():
            self._health.failed(self.backend.name, client=self._client, kind=kind)

    def hand_on(self) -> LeaseScope | None:
        """The response goes to the client: its lease is the relay's to close."""
        self._handed_on = True
        return self.lease

    def _settle(self) -> bool:
        first = not self._settled
        self._settled = True
        return first

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._settle():
            self._health.abandoned(self.backend.name, self._admission)
        if self.lease is not None and not self._handed_on:
            await self.lease.close(confirm=exc_type is None)
