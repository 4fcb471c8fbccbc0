"""llama.cpp's own endpoints: ``GET /health`` and ``GET /slots``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from hotseat_sim.model_state import LOADING_MESSAGE, Phase
from hotseat_sim.runtime import JSONBody, Sim, error_response, unavailable

router = APIRouter()


@router.get("/health", response_model=None)
async def health(sim: Sim) -> Response:
    """200 ``{"status": "ok"}`` when loaded, else 503 like llama.cpp while it loads."""
    if sim.model.phase is Phase.READY:
        return JSONBody({"status": "ok"})
    if sim.model.phase is Phase.FAILED and sim.model.error:
        return unavailable(sim.model.error)
    return unavailable(LOADING_MESSAGE)


@router.get("/slots", response_model=None)
async def slots(sim: Sim, fail_on_no_slot: int = 0) -> Response:
    """Each slot's ``id`` and ``is_processing`` (503 while loading, as llama.cpp does)."""
    if sim.model.phase is Phase.LOADING:
        return unavailable(LOADING_MESSAGE)
    if fail_on_no_slot and all(slot.processing for slot in sim.slots.slots):
        return error_response(503, "no slot available", "unavailable_error")
    return JSONBody(sim.slots.as_json())
