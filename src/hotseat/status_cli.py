"""``hotseat status``: the pools as the controller sees them, as a table or as JSON, once
or (``--watch``) on every change, from the controller's ``/v1/pool-updates`` stream."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime

import httpx

from hotseat.stack_plan import CONTROLLER_PORT
from hotseat.up_state import default_url
from hotseat_common.messages import (
    POOL_UPDATES_ERROR_EVENT,
    POOL_UPDATES_EVENT,
    POOL_UPDATES_PATH,
    GroupView,
    PoolList,
    PoolView,
)

DEFAULT_CONTROLLER_URL = f"http://127.0.0.1:{CONTROLLER_PORT}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{m}={n}" for m, n in counts.items() if n) or "-"


def _residents(p: PoolView) -> str:
    """The resident, or a capacity pool's residents (``[preload]`` on those the controller
    preloaded), its free memory, and the preload members it has still to load."""
    if p.capacity_gib is None:
        return p.resident or "-"
    names = ",".join(f"{r}[preload]" if r in p.preloaded else r for r in p.residents) or "-"
    shown = f"{names} ({p.free_gib or 0:g} of {p.capacity_gib:g} GiB free)"
    if p.preload_pending:
        shown += f" to preload: {','.join(p.preload_pending)}"
    return shown


def _swap(p: PoolView) -> str:
    """The swap's target, and while it runs its step, its time and its id (for ``hotseat
    audit swap ID``): ``coder (loading 3s of ~8s, swap gpu0-1764768000123)``."""
    if p.swapping is None:
        return "-"
    evicting = ",".join(p.evicting) or p.unloading
    step = "unloading " + evicting if evicting and p.phase == "unloading" else ""
    step = step or ("loading" if p.loading else "")
    # A capacity pool's plan may load other members at once (docs/adr/0008).
    loads = ",".join([p.swapping, *p.loading_also])
    if p.swap_elapsed_s is None:
        return loads
    progress = f"{step} {p.swap_elapsed_s:.0f}s"
    if p.swap_expected_s is not None:
        progress += f" of ~{p.swap_expected_s:.0f}s"
    if p.swap_id is not None:
        progress += f", swap {p.swap_id}"
    return f"{loads} ({progress.strip()})"


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def format_groups(groups: list[GroupView]) -> str:
    """The model groups: where each has copies, and its last placement and why
    (``placed: gpu2, reason: resident_least_busy``)."""
    header = ("GROUP", "COPIES", "LOADING", "LEASES", "WAITERS", "LAST PLACEMENT")
    rows = [
        (
            g.name,
            ",".join(g.copies) or "-",
            ",".join(g.loading) or "-",
            _counts(g.leases),
            _counts(g.waiting),
            f"placed: {g.placed}, reason: {g.reason}" if g.placed else "-",
        )
        for g in groups
    ]
    return _table(header, rows)


def format_pools(pools: list[PoolView]) -> str:
    header = ("POOL", "RESIDENT", "PHASE", "SWAPPING", "EPOCH", "LEASES", "WAITERS")
    rows = [
        (
            p.name,
            _residents(p),
            p.phase,
            _swap(p),
            str(p.epoch),
            _counts(p.leases),
            _counts(p.waiters),
        )
        for p in pools
    ]
    return _table(header, rows)


RECONNECT_S = 2.0
CLEAR = "\x1b[H\x1b[2J"


def server_sent_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """``(event, data)`` of each event of a ``text/event-stream`` (comments and ``retry``
    skipped; an event without a name is ``message``)."""
    event: str = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


def _show(pools: PoolList, args: argparse.Namespace, url: str) -> None:
    if args.json:
        print(pools.model_dump_json(indent=None if args.watch else 2), flush=True)
        return
    if args.watch and sys.stdout.isatty():
        print(CLEAR, end="")
    if args.watch:
        print(f"{url}  {datetime.now().astimezone():%H:%M:%S}  (Ctrl-C to stop)")
    print(format_pools(pools.pools), flush=True)
    if pools.groups:
        print(f"\n{format_groups(pools.groups)}", flush=True)


def _watch(args: argparse.Namespace, url: str) -> int:
    """Follow the stream; reconnect after a break (saying so on stderr) until Ctrl-C."""
    timeout = httpx.Timeout(10, read=None)
    while True:
        try:
            with httpx.stream("GET", f"{url}{POOL_UPDATES_PATH}", timeout=timeout) as response:
                response.raise_for_status()
                for event, data in server_sent_events(response.iter_lines()):
                    if event == POOL_UPDATES_EVENT:
                        _show(PoolList.model_validate_json(data), args, url)
                    elif event == POOL_UPDATES_ERROR_EVENT:
                        error = json.loads(data).get("error")
                        print(f"the controller cannot read its pools: {error}", file=sys.stderr)
        except httpx.HTTPError as exc:
            print(f"cannot watch pools at {url}: {exc}; retrying", file=sys.stderr)
        time.sleep(RECONNECT_S)  # the controller went away: try again shortly


def cmd_status(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    if args.watch:
        try:
            return _watch(args, url)
        except KeyboardInterrupt:
            return 0
    try:
        response = httpx.get(f"{url}/v1/pools", timeout=5)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cannot read pools from {url}: {exc}", file=sys.stderr)
        return 1
    _show(PoolList.model_validate_json(response.content), args, url)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="print every pool's residency, leases and waiters")
    status.add_argument(
        "--url",
        default=default_url("controller", "HOTSEAT_CONTROLLER_URL", DEFAULT_CONTROLLER_URL),
        help=(
            "the controller's admin URL (env HOTSEAT_CONTROLLER_URL, else the running "
            f"`hotseat up`'s, else {DEFAULT_CONTROLLER_URL})"
        ),
    )
    status.add_argument(
        "--watch", action="store_true", help="print again on every change, until Ctrl-C"
    )
    status.add_argument(
        "--json",
        action="store_true",
        help="print the controller's JSON (GET /v1/pools) instead of a table; with --watch,"
        " one line per change",
    )
    status.set_defaults(func=cmd_status)
