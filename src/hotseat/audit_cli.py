"""``hotseat audit``: look at audit events from a terminal.

- ``hotseat audit query``: events from the audit service's query API, filtered, newest
  first, as a table (``--all`` follows every page, ``--json`` prints JSON lines).
- ``hotseat audit swap ID``: one swap: its cause, the requests that waited for it, and
  how long each of its phases took.
- ``hotseat audit summary``: counts by outcome and by pool/member over a window.
- ``hotseat audit tail``: follow new events live from JetStream with an ephemeral
  consumer (the audit service need not be running).
- ``hotseat audit schema``: the audit event's JSON Schema.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson

from hotseat.stack_plan import AUDIT_PORT
from hotseat.up_state import default_url
from hotseat_common.durations import parse_duration
from hotseat_common.subjects import DEFAULT_AUDIT_STREAM, DEFAULT_PREFIX, Subjects

DEFAULT_URL = f"http://127.0.0.1:{AUDIT_PORT}"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
HTTP_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
NATS_CONNECT_TIMEOUT = 3.0
EXIT_OK = 0
EXIT_FAILED = 1

HEADERS = ["TIME", "KIND", "OUTCOME", "POOL/MEMBER", "ROUTER", "RULE", "BACKEND", "STATUS",
           "MS", "REQUEST_ID", "DETAIL"]  # fmt: skip
TAIL_WIDTHS = [24, 7, 23, 18, 10, 14, 12, 6, 8, 18, 0]
FILTERS = ["outcome", "kind", "pool", "member", "router", "rule", "request_id", "swap_id"]


def echo(text: str, *, err: bool = False) -> None:
    """Write one line now (tail output is read line by line by other programs)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def _time(value: str | None) -> str:
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return value
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def event_cells(event: dict[str, Any]) -> list[str]:
    """One table row for an event (missing fields are blank)."""
    pool = event.get("pool") or ""
    member = event.get("member")
    detail = event.get("reason") or ""
    if event.get("from_member") or event.get("to_member"):
        move = f"{event.get('from_member') or '-'} -> {event.get('to_member') or '-'}"
        detail = f"{move} {detail}".strip()
    duration = event.get("duration_ms")
    return [
        _time(event.get("time")),
        str(event.get("kind", "")),
        str(event.get("outcome", "")),
        f"{pool}/{member}" if member else pool,
        event.get("router") or event.get("controller") or "",
        event.get("rule") or "",
        event.get("backend") or "",
        "" if event.get("status") is None else str(event["status"]),
        "" if duration is None else f"{duration:.0f}",
        event.get("request_id") or "",
        detail,
    ]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is not padded."""
    table = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i < len(widths) - 1 else cell for i, (cell, w) in
                  enumerate(zip(row, widths, strict=True))).rstrip()
        for row in table
    )  # fmt: skip


def _fixed_row(cells: Sequence[str]) -> str:
    return "  ".join(
        cell.ljust(width) if width else cell for cell, width in zip(cells, TAIL_WIDTHS, strict=True)
    ).rstrip()


def _moment(text: str) -> str:
    """An ISO timestamp as given, or a duration (``15m``, ``2h``) meaning that long ago."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        try:
            datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither an ISO timestamp nor a duration like 15m"
            ) from None
        return text
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


def _api_error(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{response.status_code} {error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:500]}"


def cmd_query(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {name: getattr(args, name) for name in FILTERS if getattr(args, name)}
    if args.since:
        params["since"] = args.since
    if args.until:
        params["until"] = args.until
    params["limit"] = args.limit
    cursor = args.cursor
    events: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=args.url, timeout=HTTP_TIMEOUT) as client:
            while True:
                response = client.get(
                    "/v1/events", params={**params, "cursor": cursor} if cursor else params
                )
                if response.status_code != 200:
                    echo(f"hotseat audit query: {_api_error(response)}", err=True)
                    return EXIT_FAILED
                body = response.json()
                events.extend(body["events"])
                cursor = body["next"]
                if not (args.all and cursor):
                    break
    except httpx.HTTPError as exc:
        echo(f"hotseat audit query: cannot reach {args.url}: {exc}", err=True)
        return EXIT_FAILED
    if args.json:
        for event in events:
            echo(orjson.dumps(event).decode())
    else:
        echo(format_table(HEADERS, (event_cells(e) for e in events)))
        echo(f"({len(events)} event{'s' if len(events) != 1 else ''})")
    if cursor and not args.all:
        echo(f"more: --cursor {cursor}  (or --all)", err=True)
    return EXIT_OK


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def format_swap(report: dict[str, Any]) -> str:
    """A swap report (``GET /v1/swaps/{id}``) as a few lines and a table of its waiters."""
    move = f"{report.get('from_member') or '-'} -> {report.get('to_member') or '-'}"
    pool = report.get("pool") or "-"
    lines = [f"swap {report['swap_id']}  pool {pool}  {move}  {report['outcome']}"]
    cause = report["cause"]
    said = f"cause: {cause.get('reason') or 'unknown'}"
    if cause.get("request_id"):
        said += f", request {cause['request_id']}"
        request = cause.get("request")
        if request:
            said += f" ({request['outcome']}, {_ms(request.get('duration_ms'))})"
    lines.append(said)
    phases = report["phases"]
    lines.append(
        f"phases: unloading {_ms(phases.get('unload_ms'))}, loading {_ms(phases.get('load_ms'))}"
        f", total {_ms(phases.get('total_ms'))}"
    )
    waiters = report["waiters"]
    lines.append(f"waiters: {len(waiters)}")
    if waiters:
        rows = (
            [_time(w["time"]), w.get("request_id") or "", w["outcome"], w.get("member") or "",
             w.get("rule") or "", _ms(w.get("duration_ms")), "cause" if w["caused"] else ""]
            for w in waiters
        )  # fmt: skip
        headers = ["ENDED", "REQUEST_ID", "OUTCOME", "MEMBER", "RULE", "TOOK", ""]
        lines.append(format_table(headers, rows))
    return "\n".join(lines)


def cmd_swap(args: argparse.Namespace) -> int:
    try:
        with httpx.Client(base_url=args.url, timeout=HTTP_TIMEOUT) as client:
            response = client.get(f"/v1/swaps/{args.swap_id}")
    except httpx.HTTPError as exc:
        echo(f"hotseat audit swap: cannot reach {args.url}: {exc}", err=True)
        return EXIT_FAILED
    if response.status_code != 200:
        echo(f"hotseat audit swap: {_api_error(response)}", err=True)
        return EXIT_FAILED
    body = response.json()
    echo(orjson.dumps(body).decode() if args.json else format_swap(body))
    return EXIT_OK


def cmd_summary(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("since", args.since), ("until", args.until)) if v}
    try:
        with httpx.Client(base_url=args.url, timeout=HTTP_TIMEOUT) as client:
            response = client.get("/v1/summary", params=params)
    except httpx.HTTPError as exc:
        echo(f"hotseat audit summary: cannot reach {args.url}: {exc}", err=True)
        return EXIT_FAILED
    if response.status_code != 200:
        echo(f"hotseat audit summary: {_api_error(response)}", err=True)
        return EXIT_FAILED
    body = response.json()
    if args.json:
        echo(orjson.dumps(body).decode())
        return EXIT_OK
    echo(f"{_time(body['since'])} .. {_time(body['until'])}: {body['total']} events")
    echo("")
    echo(format_table(["OUTCOME", "COUNT"], ([o, str(n)] for o, n in body["by_outcome"].items())))
    if body["by_pool"]:
        echo("")
        rows = (
            [p["pool"], p["member"] or "", str(p["total"]),
             ", ".join(f"{o}={n}" for o, n in p["by_outcome"].items())]
            for p in body["by_pool"]
        )  # fmt: skip
        echo(format_table(["POOL", "MEMBER", "COUNT", "OUTCOMES"], rows))
    return EXIT_OK


async def _tail(args: argparse.Namespace) -> int:
    import nats  # noqa: PLC0415 - only tail needs NATS
    from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: PLC0415

    subject = Subjects(args.subject_prefix).audit_filter(args.kind, args.outcome)
    try:
        nc = await nats.connect(args.nats_url, connect_timeout=NATS_CONNECT_TIMEOUT,
                                max_reconnect_attempts=-1)  # fmt: skip
    except Exception as exc:
        echo(f"hotseat audit tail: cannot connect to {args.nats_url}: {exc}", err=True)
        return EXIT_FAILED
    try:
        js = nc.jetstream()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
        if args.last:
            info = await asyncio.wait_for(js.stream_info(args.stream), 5)
            first = max(1, (info.state.last_seq or 0) - args.last + 1)
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first
            )
        sub = await js.subscribe(subject, stream=args.stream, ordered_consumer=True, config=config)
        if not args.json:
            echo(_fixed_row(HEADERS))
        seen = 0
        async for msg in sub.messages:
            try:
                event = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                event = None
            if not isinstance(event, dict):
                echo(f"<not an event on {msg.subject}: {msg.data[:80]!r}>")
            elif args.json:
                echo(orjson.dumps(event).decode())
            else:
                echo(_fixed_row(event_cells(event)))
            seen += 1
            if args.count and seen >= args.count:
                break
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return EXIT_OK


def cmd_tail(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_tail(args))
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_schema(_args: argparse.Namespace) -> int:
    from hotseat_audit.schema import render  # noqa: PLC0415 - keeps the CLI start light

    sys.stdout.write(render())
    return EXIT_OK


def _window_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=_moment, help="ISO time or a duration ago (15m, 2h)")
    parser.add_argument("--until", type=_moment, help="ISO time or a duration ago (exclusive)")
    _service_flags(parser)


def _service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=default_url("audit", "HOTSEAT_AUDIT_URL", DEFAULT_URL),
        help=(
            "audit service (env HOTSEAT_AUDIT_URL, else the running `hotseat up`'s, "
            f"else {DEFAULT_URL})"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers: Any) -> None:
    """Add ``hotseat audit ...`` to the operator CLI."""
    audit = subparsers.add_parser("audit", help="query and follow audit events")
    commands = audit.add_subparsers(dest="audit_command", required=True)

    query = commands.add_parser("query", help="events from the audit service, newest first")
    for name in FILTERS:
        query.add_argument(
            f"--{name.replace('_', '-')}", dest=name, action="append",
            help=f"only events with this {name} (repeat for any of several)",
        )  # fmt: skip
    _window_flags(query)
    query.add_argument("--limit", type=int, default=50, help="events per page (1..1000)")
    query.add_argument("--all", action="store_true", help="follow every page")
    query.add_argument("--cursor", help="continue from a previous page's cursor")
    query.set_defaults(func=cmd_query)

    swap = commands.add_parser(
        "swap", help="one swap: its cause, its waiters and how long each phase took"
    )
    swap.add_argument("swap_id", help="the swap's id (its events' swap_id)")
    _service_flags(swap)
    swap.set_defaults(func=cmd_swap)

    summary = commands.add_parser("summary", help="counts by outcome and pool/member")
    _window_flags(summary)
    summary.set_defaults(func=cmd_summary)

    tail = commands.add_parser("tail", help="follow new events live from JetStream")
    tail.add_argument(
        "--nats-url", default=default_url("nats", "HOTSEAT_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server (env HOTSEAT_NATS_URL, else the running `hotseat up`'s)",
    )  # fmt: skip
    tail.add_argument(
        "--subject-prefix", default=os.environ.get("HOTSEAT_SUBJECT_PREFIX", DEFAULT_PREFIX),
        help="subject prefix (env HOTSEAT_SUBJECT_PREFIX)",
    )  # fmt: skip
    tail.add_argument(
        "--stream", default=os.environ.get("HOTSEAT_AUDIT_STREAM", DEFAULT_AUDIT_STREAM),
        help="audit stream (env HOTSEAT_AUDIT_STREAM)",
    )  # fmt: skip
    tail.add_argument("--kind", choices=["request", "pool"], help="only this kind")
    tail.add_argument("--outcome", help="only this outcome")
    tail.add_argument("--last", type=int, default=0, help="start with the last N events")
    tail.add_argument("--count", type=int, default=0, help="exit after N events")
    tail.add_argument("--json", action="store_true", help="print JSON lines")
    tail.set_defaults(func=cmd_tail)

    schema = commands.add_parser("schema", help="print the audit event JSON Schema")
    schema.set_defaults(func=cmd_schema)
