"""HTTP probes the drivers share: llama.cpp-style ``/slots`` and JSON field checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from hotseat_pool_controller.drivers.base import DriverError


def slots_busy(slots: Any) -> bool:
    """Whether a llama.cpp ``/slots`` answer shows a slot at work.

    Recent llama.cpp reports ``is_processing`` per slot; older builds report ``state``
    (0 idle, anything else processing). Any other shape is an error, never "idle".
    """
    if not isinstance(slots, list):
        raise TypeError(f"expected a list of slots, got {type(slots).__name__}")
    busy = False
    for slot in slots:
        if not isinstance(slot, dict):
            raise TypeError(f"expected a slot object, got {type(slot).__name__}")
        if isinstance(slot.get("is_processing"), bool):
            busy = busy or slot["is_processing"]
        elif isinstance(slot.get("state"), int):
            busy = busy or slot["state"] != 0
        else:
            raise TypeError("slot has neither is_processing nor state")
    return busy


async def fetch_idle(client: httpx.AsyncClient, member: str, url: str) -> bool:
    """True when no slot at ``url`` is processing; :class:`DriverError` when unknown."""
    try:
        response = await client.get(url)
        response.raise_for_status()
        return not slots_busy(response.json())
    except (httpx.HTTPError, ValueError, TypeError) as exc:
        raise DriverError(f"{member}: cannot tell whether idle from {url}: {exc}") from exc


def field_values(document: Any, path: str) -> Iterator[Any]:
    """Values at ``path`` in a JSON document: dotted keys, ``[]`` for every list item.

    ``is_sleeping`` reads a top-level key; ``models[].name`` reads ``name`` of each item
    of the ``models`` list. A missing key yields nothing.
    """
    nodes: list[Any] = [document]
    for part in path.split("."):
        each = part.endswith("[]")
        key = part.removesuffix("[]")
        found: list[Any] = []
        for node in nodes:
            if not key:
                value = node
            elif isinstance(node, dict) and key in node:
                value = node[key]
            else:
                continue
            if not each:
                found.append(value)
            elif isinstance(value, list):
                found.extend(value)
        nodes = found
    yield from nodes


def json_equal(value: Any, expected: Any) -> bool:
    """JSON equality: ``false`` is not ``0`` and ``true`` is not ``1``."""
    return isinstance(value, bool) == isinstance(expected, bool) and value == expected
