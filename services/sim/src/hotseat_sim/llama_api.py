"""llama.cpp's own endpoints: ``GET /health``, ``GET /slots`` and ``POST /slots/{id}``
(save, restore and erase a slot's prompt cache: :mod:`.slot_files`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from hotseat_sim import slot_files
from hotseat_sim.model_state import LOADING_MESSAGE, Phase
from hotseat_sim.runtime import BadRequest, JSONBody, Sim, error_response, read_json, unavailable

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
    return JSONBody(sim.slots.as_json(sim.model.generation))


@router.post("/slots/{slot_id}", response_model=None)
async def slot_action(slot_id: int, request: Request, sim: Sim, action: str = "") -> Response:
    """``?action=save|restore`` with ``{"filename": NAME}``, or ``?action=erase``."""
    if sim.model.phase is not Phase.READY:
        return unavailable(LOADING_MESSAGE)
    try:
        if action == "erase":
            return JSONBody(await slot_files.erase(sim, slot_id))
        if action not in {"save", "restore"}:
            return error_response(400, "Invalid action", "invalid_request_error")
        try:
            body = await read_json(request)
        except BadRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        filename = body.get("filename") if isinstance(body, dict) else None
        step = slot_files.save if action == "save" else slot_files.restore
        return JSONBody(await step(sim, slot_id, filename))
    except slot_files.SlotActionError as exc:
        return error_response(exc.status, exc.message, exc.kind)
