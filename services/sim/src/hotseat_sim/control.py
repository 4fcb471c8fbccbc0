"""The control API that the controller's ``sim`` residency driver drives.

- ``POST /control/load`` ``{"epoch": n}``: 202 ``{"state": "loading"}``, ready after
  ``loadSeconds``; 200 with the current state when already loading or ready. A load that
  does not fit the GPU's ``gpuMemoryGiB`` fails at once: 202 ``{"state": "failed",
  "error": "out of memory: ..."}``, the state stays ``failed`` and the ledger records ``oom``.
- ``POST /control/unload`` ``{"epoch": n}``: 202 ``{"state": "unloading"}``, in-flight
  requests are dropped, the memory is released after ``unloadSeconds`` (state
  ``unloaded``); 200 with the current state when already unloading, unloaded or failed.
- ``GET /control/state``: ``{"state", "pool", "member", "error", "in_flight", "epoch"}``;
  ``?until=ready,failed&timeout=10`` waits (long poll) until the state is one of those.
- ``POST /control/crash`` ``{"reason": "..."}``: die out of band (fault tests).
- ``POST /control/hold`` ``{"phases": ["unloading"]}``: loads or unloads do not finish
  while their phase is held (fault tests act in the middle of one); ``[]`` lets them end.

``epoch`` may be omitted; one lower than the highest this sim has seen gets 409.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from hotseat_sim.model_state import ControlResult, Phase, StaleEpoch
from hotseat_sim.runtime import (
    BadRequest,
    JSONBody,
    Sim,
    error_response,
    invalid_request,
    read_json,
)

router = APIRouter(prefix="/control")


async def _command(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    epoch = body.get("epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
        raise BadRequest("'epoch' must be an integer")
    return body


def _answer(result: ControlResult) -> Response:
    return JSONBody(result.body, status_code=result.status)


def _stale(sim: Sim, exc: StaleEpoch) -> Response:
    return error_response(
        409, str(exc), "conflict_error", state=sim.model.phase.value, epoch=exc.seen
    )


@router.post("/load", response_model=None)
async def load(request: Request, sim: Sim) -> Response:
    return await _control(request, sim, sim.model.load)


@router.post("/unload", response_model=None)
async def unload(request: Request, sim: Sim) -> Response:
    return await _control(request, sim, sim.model.unload)


async def _control(
    request: Request, sim: Sim, action: Callable[[int | None], Awaitable[ControlResult]]
) -> Response:
    """A load, unload or fence command, fenced by its ``epoch``."""
    try:
        command = await _command(request)
    except BadRequest as exc:
        return invalid_request(str(exc))
    try:
        return _answer(await action(command.get("epoch")))
    except StaleEpoch as exc:
        return _stale(sim, exc)


@router.post("/fence", response_model=None)
async def fence(request: Request, sim: Sim) -> Response:
    """Record an epoch without acting: later commands of an older epoch are refused."""
    return await _control(request, sim, sim.model.fence)


MAX_WAIT_S = 30.0


@router.get("/state", response_model=None)
async def state(sim: Sim, until: str | None = None, timeout: float = 10.0) -> Response:
    """The current state; with ``until=ready,failed`` it first waits (long poll, at most
    ``timeout`` seconds, capped at 30) until the state is one of those."""
    if until:
        wanted = frozenset(s.strip() for s in until.split(",") if s.strip())
        await sim.model.wait_for(wanted, min(max(timeout, 0.0), MAX_WAIT_S))
    return JSONBody(sim.model.snapshot())


@router.post("/crash", response_model=None)
async def crash(request: Request, sim: Sim) -> Response:
    try:
        command = await _command(request)
    except BadRequest as exc:
        return invalid_request(str(exc))
    reason = command.get("reason")
    return _answer(await sim.model.crash(reason if isinstance(reason, str) else "crashed"))


HOLDABLE = frozenset({Phase.LOADING, Phase.UNLOADING})


@router.post("/hold", response_model=None)
async def hold(request: Request, sim: Sim) -> Response:
    """Fault injection: hold loads or unloads in their phase until told otherwise."""
    try:
        command = await _command(request)
    except BadRequest as exc:
        return invalid_request(str(exc))
    phases = command.get("phases")
    if not isinstance(phases, list) or not all(
        isinstance(p, str) and p in HOLDABLE for p in phases
    ):
        return invalid_request("'phases' must be a list of 'loading' and 'unloading'")
    sim.model.hold(frozenset(Phase(p) for p in phases))
    return JSONBody(sim.model.snapshot())
