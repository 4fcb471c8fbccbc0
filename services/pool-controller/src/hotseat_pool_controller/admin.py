"""The controller's admin API: read pools freely, force a swap or an unload with a token.

An action's token is checked before its body is read: a client without the token gets
401 whatever it sends, and learns nothing of the body's schema. The bodies are strict
(``force`` is a JSON boolean, never ``"yes"`` or ``1``) and take no other keys.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, SecretStr

from hotseat_common.messages import ErrorReply, PoolList, PoolView
from hotseat_pool_controller.console import read_pools
from hotseat_pool_controller.model import Decision
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.runtime.placement import GroupPlacer


class UnloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    force: bool = False
    """Skip the incumbent's ``/slots`` check (``busySignal: leasesAndSlots``), for a member
    whose slots stay busy (hung); live leases still refuse the action."""


class SwapBody(UnloadBody):
    member: str


class ActionResult(BaseModel):
    pool: str
    status: str
    """``started`` (a swap now runs), or ``noop`` (nothing to do)."""
    target: str | None = None
    epoch: int | None = None


def _authorize(token: SecretStr | None, authorization: str | None) -> None:
    if token is None or not token.get_secret_value().strip():
        # An empty token would make "Bearer " an admin credential: it disables instead.
        raise HTTPException(403, "admin actions are disabled: set HOTSEAT_ADMIN_TOKEN")
    expected = f"Bearer {token.get_secret_value()}".encode()
    if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
        raise HTTPException(401, "missing or wrong admin token", {"WWW-Authenticate": "Bearer"})


def _token_first(token: SecretStr | None) -> type[APIRoute]:
    """The route class of the admin actions: the token is checked before FastAPI reads
    or validates the body (a dependency would run only after the body is parsed)."""

    class TokenFirstRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def authorized(request: Request) -> Response:
                _authorize(token, request.headers.get("authorization"))
                return await handler(request)

            return authorized

    return TokenFirstRoute


def _result(pool: str, decision: Decision) -> ActionResult:
    if isinstance(decision.reply, ErrorReply):
        raise HTTPException(409, f"{decision.reply.code}: {decision.reply.message}")
    if decision.swap is None:
        return ActionResult(pool=pool, status="noop")
    return ActionResult(
        pool=pool, status="started", target=decision.swap.target or None, epoch=decision.swap.epoch
    )


def admin_router(
    pools: Mapping[str, PoolAnswers],
    token: SecretStr | None,
    groups: Mapping[str, GroupPlacer] | None = None,
) -> APIRouter:
    router = APIRouter(prefix="/v1/pools", tags=["pools"])
    actions = APIRouter(route_class=_token_first(token))

    def pool_or_404(name: str) -> PoolAnswers:
        pool = pools.get(name)
        if pool is None:
            raise HTTPException(404, f"no pool {name!r}")
        return pool

    @router.get("")
    async def list_pools() -> PoolList:
        return await read_pools(pools, groups)

    @router.get("/{name}")
    async def get_pool(name: str) -> PoolView:
        return await pool_or_404(name).view()

    @actions.post("/{name}/swap")
    async def force_swap(name: str, body: SwapBody) -> ActionResult:
        pool = pool_or_404(name)
        if body.member not in pool.policy.members:
            raise HTTPException(404, f"pool {name!r} has no member {body.member!r}")
        return _result(name, await pool.admin_swap(body.member, force=body.force))

    @actions.post("/{name}/unload")
    async def force_unload(name: str, body: UnloadBody | None = None) -> ActionResult:
        force = body.force if body is not None else False
        return _result(name, await pool_or_404(name).admin_unload(force=force))

    router.include_router(actions)
    return router
