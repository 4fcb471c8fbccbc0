"""Debug endpoints for tests of what reaches a backend (header hygiene, model rewrite).

- ``/debug/echo`` (any method): the request's method, path, query, headers and body.
- ``GET /debug/requests``: the last requests to the OpenAI endpoints (the time their
  head reached the sim, method, path, headers, body), oldest first; ``DELETE
  /debug/requests`` forgets them.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from hotseat_sim.runtime import BadRequest, JSONBody, Sim, headers_of, read_json

router = APIRouter(prefix="/debug")


@router.api_route("/echo", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], response_model=None)
async def echo(request: Request, sim: Sim) -> Response:
    try:
        body = await read_json(request)
    except BadRequest:
        body = (await request.body()).decode(errors="replace")
    await sim.requests.record(request, body)
    return JSONBody(
        {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": headers_of(request),
            "body": body,
            "member": sim.profile.member,
        }
    )


@router.get("/requests", response_model=None)
async def requests(sim: Sim) -> Response:
    return JSONBody({"requests": list(sim.requests.entries)})


@router.delete("/requests", response_model=None)
async def forget(sim: Sim) -> Response:
    sim.requests.entries.clear()
    return Response(status_code=204)
