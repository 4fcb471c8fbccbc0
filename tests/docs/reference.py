"""Write the generated parts of docs/metrics.md and docs/audit-events.md from the code.

Usage: ``python -m tests.docs.reference`` (``make docs-reference``) rewrites the tables
between the ``BEGIN GENERATED`` / ``END GENERATED`` markers; ``--check`` only reports
(exit 1) when a page is out of date. tests/docs/test_reference.py runs the check, so a
new metric or audit outcome cannot ship undocumented.

Metrics come from the metric classes of ``hotseat_common.metrics`` (name, type, labels,
help, and which service exports them); audit events from
``hotseat_common.messages.audit`` (outcomes, fields, subjects), with the one-line
meaning of each outcome kept in :data:`OUTCOMES` below, which must name every outcome.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from hotseat_common import metrics
from hotseat_common.messages.audit import AuditEvent, PoolOutcome, RequestOutcome
from hotseat_common.subjects import DEFAULT_PREFIX, Subjects

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRICS_DOC = DOCS / "metrics.md"
AUDIT_DOC = DOCS / "audit-events.md"
BEGIN = "<!-- BEGIN GENERATED: {} (python -m tests.docs.reference) -->"
END = "<!-- END GENERATED: {} -->"

EXPORTERS: tuple[tuple[str, Callable[[CollectorRegistry], object]], ...] = (
    ("router", metrics.RouterMetrics),
    ("controller", metrics.PoolMetrics),
    ("audit", metrics.AuditMetrics),
)

OUTCOMES: dict[str, tuple[str, str]] = {
    # request outcomes: (what the client got, meaning)
    "served": (
        "the backend's status",
        "A backend answered (its own 4xx included); the response was relayed to its end.",
    ),
    "pool_activation_timeout": (
        "503 + Retry-After",
        "The request was held for its pool member longer than the pool's `swapBudget`.",
    ),
    "pool_incumbent_busy": (
        "503 + Retry-After",
        (
            "Every backend of the rule was skipped because its pool's incumbent was busy "
            "(`IfIdle`); a retry is served."
        ),
    ),
    "pool_queue_full": (
        "503 + Retry-After",
        "The pool already held `maxWaiters` requests and nothing else could serve this one.",
    ),
    "all_backends_failed": (
        "502 (504 past `router.requestTimeout`)",
        (
            "Every backend of the rule was tried and failed (connection, timeout, 5xx) or was "
            "quarantined."
        ),
    ),
    "no_route": (
        "404",
        "No rule matched the model and there is no default route (`model_not_found`).",
    ),
    "fail_closed": (
        "503 + Retry-After",
        (
            "Refused rather than risk it: a sensitive request whose other backends are cloud "
            "ones, or a pool controller that could not vouch for its member (`reason: "
            "controller_unavailable`)."
        ),
    ),
    "client_disconnected": (
        "(none)",
        (
            "The client went away before the answer ended (held, waiting for headers, or "
            "mid-stream)."
        ),
    ),
    "rejected": (
        "400, 401, 413",
        (
            "Refused before routing: invalid JSON, a missing or wrong API key, a body over "
            "`router.maxBodyBytes`."
        ),
    ),
    # pool outcomes: (who publishes it, meaning)
    "busy_skip": (
        "router",
        (
            "One backend skipped under `IfIdle` because its incumbent was busy; carries the "
            "request id. One per skipped backend."
        ),
    ),
    "swap_started": (
        "controller",
        "The controller began unloading the incumbent for `to_member` (a new `epoch`).",
    ),
    "swap_completed": (
        "controller",
        "`to_member` is ready and resident; `duration_ms` is the whole swap.",
    ),
    "swap_failed": (
        "controller",
        (
            "The swap failed (driver error or `swapTimeout`); the target was unloaded and waiters "
            "got an error. `reason` says why. In a capacity pool a plan that loads several "
            "members at once has one for each of the others that fails alone (`to_member` it, "
            "same `swap_id`), before the plan's own end."
        ),
    ),
    "swap_cancelled": (
        "controller",
        (
            "The demand for the target left before its load began; nothing was loaded. A "
            "drain toward a member whose waiters all left before its swap began ends the same "
            "way, with `reason: demand_gone_while_draining`, no `swap_id` and no "
            "`swap_started` before it. Or, with `reason: pool_state_lost`, the store lost the "
            "pool's state while the swap ran (Redis restarted empty, or failed over): the pool "
            "was rebuilt from what its members report, so the target may be resident; the "
            "swap's owner sends this end once the pool is rebuilt (under an id derived from "
            "the swap, stored once whoever sends it)."
        ),
    ),
    "swap_retargeted": (
        "controller",
        (
            "A swap still unloading loads another member than it started for: right before "
            "its load began, a more urgent member waited (`reason` `more_urgent`). "
            "`from_member` is the target it had, `to_member` the one it loads; the same "
            "`epoch` and `swap_id`. The first target's requests stay held for a later swap."
        ),
    ),
    "lease_expired": (
        "controller",
        (
            "A router stopped renewing a lease (it died or lost NATS); the lease was reclaimed "
            "after `leaseTtl`."
        ),
    ),
    "resident_lost": (
        "controller",
        (
            "The resident stopped answering its health check (crash, OOM, scaled away); the pool "
            "is cold until the next acquire."
        ),
    ),
}


# --- metrics --------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    exporters: tuple[str, ...]


def collect_metrics() -> list[Metric]:
    """Every metric of every service, merged by name (the audit publisher's are shared)."""
    found: dict[str, Metric] = {}
    for service, build in EXPORTERS:
        for metric in _wrappers(build(CollectorRegistry())):
            name = metric._name + ("_total" if metric._type == "counter" else "")
            labels = tuple(metric._labelnames)
            known = found.get(name)
            exporters = (*known.exporters, service) if known else (service,)
            found[name] = Metric(name, metric._type, labels, metric._documentation, exporters)
    return sorted(found.values(), key=lambda m: m.name)


def _wrappers(holder: object) -> Iterator[MetricWrapperBase]:
    for value in vars(holder).values():
        if isinstance(value, MetricWrapperBase):
            yield value
        elif type(value).__module__ == metrics.__name__:
            yield from _wrappers(value)


def metrics_table() -> str:
    lines = [
        "| metric | type | labels | exported by | meaning |",
        "|---|---|---|---|---|",
    ]
    lines.extend(
        f"| `{m.name}` | {m.kind} | {', '.join(f'`{label}`' for label in m.labels) or '-'} "
        f"| {', '.join(m.exporters)} | {m.help} |"
        for m in collect_metrics()
    )
    return "\n".join(lines)


# --- audit events -----------------------------------------------------------------------


def audit_tables() -> str:
    subjects = Subjects(DEFAULT_PREFIX)
    lines = ["### Request outcomes (`kind: request`, published by the router)", ""]
    lines += ["| outcome | client got | meaning |", "|---|---|---|"]
    lines += [
        f"| `{o.value}` | {OUTCOMES[o.value][0]} | {OUTCOMES[o.value][1]} |" for o in RequestOutcome
    ]
    lines += ["", "### Pool outcomes (`kind: pool`)", ""]
    lines += ["| outcome | published by | meaning |", "|---|---|---|"]
    lines += [
        f"| `{o.value}` | {OUTCOMES[o.value][0]} | {OUTCOMES[o.value][1]} |" for o in PoolOutcome
    ]
    lines += ["", "### Fields", "", "| field | type |", "|---|---|"]
    lines += [
        f"| `{name}` | {_type_name(field.annotation)} |"
        for name, field in AuditEvent.model_fields.items()
    ]
    example = subjects.audit("request", RequestOutcome.POOL_ACTIVATION_TIMEOUT.value)
    lines += [
        "",
        f"Subject of each event: `{subjects.audit('<kind>', '<outcome>')}`, e.g. `{example}`.",
    ]
    return "\n".join(lines)  # fmt: skip


def _type_name(annotation: object) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    args = typing.get_args(annotation)
    if args:
        text = " \\| ".join(
            repr(a) if not isinstance(a, type) else a.__name__ for a in args
        ).replace("NoneType", "null")
    return text.replace("typing.", "")


# --- writing ----------------------------------------------------------------------------


def render(text: str, section: str, body: str) -> str:
    begin, end = BEGIN.format(section), END.format(section)
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"markers for {section!r} not found")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


PAGES = ((METRICS_DOC, "metrics", metrics_table), (AUDIT_DOC, "audit events", audit_tables))


def stale_pages() -> list[Path]:
    return [
        path
        for path, section, body in PAGES
        if render(path.read_text(encoding="utf-8"), section, body())
        != path.read_text(encoding="utf-8")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for path in stale:
            print(f"{path} is out of date: run python -m tests.docs.reference")
        return 1 if stale else 0
    for path, section, body in PAGES:
        path.write_text(render(path.read_text(encoding="utf-8"), section, body()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
