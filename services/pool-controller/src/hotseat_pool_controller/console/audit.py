"""What the console asks of the audit service (``HOTSEAT_AUDIT_URL``): a window of events,
page after page up to a bound, and the per-rule summary. The browser never talks to the
audit service itself: one origin, no CORS, and an audit service that is not exposed
beyond the cluster still feeds the console."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

MAX_PAGE = 1000
"""Events per audit page (the audit API's largest page)."""


class AuditUnavailable(Exception):
    """The audit service did not answer, or answered with an error."""


class AuditReader:
    def __init__(self, url: str, *, timeout: float = 5.0, max_events: int = 5000) -> None:
        self._client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout)
        self._max_events = max_events

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, path: str, params: list[tuple[str, str]]) -> dict[str, Any]:
        try:
            response = await self._client.get(path, params=tuple(params))
        except httpx.HTTPError as exc:
            raise AuditUnavailable(f"audit service unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise AuditUnavailable(f"audit service answered {response.status_code}")
        body: dict[str, Any] = response.json()
        return body

    async def events(
        self, filters: list[tuple[str, str]], *, since: datetime, until: datetime
    ) -> tuple[list[dict[str, Any]], bool]:
        """Events in ``[since, until)`` matching ``filters``, newest first, and whether
        more were there than the bound allows (the oldest are then left out)."""
        base = [
            *filters,
            ("since", since.isoformat()),
            ("until", until.isoformat()),
            ("limit", str(MAX_PAGE)),
        ]
        events: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self._get("/v1/events", [*base, *([("cursor", cursor)] if cursor else [])])
            events.extend(page.get("events", []))
            cursor = page.get("next")
            if cursor is None:
                return events, False
            if len(events) >= self._max_events:
                return events, True

    async def summary(self, *, since: datetime, until: datetime) -> dict[str, Any]:
        return await self._get(
            "/v1/summary", [("since", since.isoformat()), ("until", until.isoformat())]
        )
