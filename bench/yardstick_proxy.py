"""The yardstick: a minimal FastAPI + httpx pass-through proxy, written the obvious way.

Run: YARDSTICK_UPSTREAM=http://127.0.0.1:9200 uvicorn --app-dir bench yardstick_proxy:app
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

UPSTREAM = os.environ.get("YARDSTICK_UPSTREAM", "http://127.0.0.1:9200")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(
        base_url=UPSTREAM, timeout=httpx.Timeout(60.0), limits=limits
    ) as client:
        yield {"client": client}


app = FastAPI(lifespan=lifespan)


@app.post("/v1/{path:path}")
async def proxy(path: str, request: Request) -> StreamingResponse:
    client: httpx.AsyncClient = request.state.client
    body = await request.body()
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    upstream = await client.send(
        client.build_request("POST", f"/v1/{path}", content=body, headers=headers), stream=True
    )
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
        background=BackgroundTask(upstream.aclose),
    )
