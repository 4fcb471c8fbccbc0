"""``hotseat status``: the pools as the controller sees them, as a table."""

from __future__ import annotations

import argparse
import sys

import httpx

from hotseat.stack_plan import CONTROLLER_PORT
from hotseat.up_state import default_url
from hotseat_common.messages import PoolList, PoolView

DEFAULT_CONTROLLER_URL = f"http://127.0.0.1:{CONTROLLER_PORT}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{m}={n}" for m, n in counts.items() if n) or "-"


def _swap(p: PoolView) -> str:
    """The swap's target, and while it runs its step and time: ``coder (loading 3s of ~8s)``."""
    if p.swapping is None:
        return "-"
    step = "unloading " + p.unloading if p.unloading else ("loading" if p.loading else "")
    if p.swap_elapsed_s is None:
        return p.swapping
    progress = f"{step} {p.swap_elapsed_s:.0f}s"
    if p.swap_expected_s is not None:
        progress += f" of ~{p.swap_expected_s:.0f}s"
    return f"{p.swapping} ({progress.strip()})"


def format_pools(pools: list[PoolView]) -> str:
    header = ("POOL", "RESIDENT", "PHASE", "SWAPPING", "EPOCH", "LEASES", "WAITERS")
    rows = [
        (
            p.name,
            p.resident or "-",
            p.phase,
            _swap(p),
            str(p.epoch),
            _counts(p.leases),
            _counts(p.waiters),
        )
        for p in pools
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def cmd_status(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    try:
        response = httpx.get(f"{url}/v1/pools", timeout=5)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cannot read pools from {url}: {exc}", file=sys.stderr)
        return 1
    print(format_pools(PoolList.model_validate_json(response.content).pools))
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
    status.set_defaults(func=cmd_status)
