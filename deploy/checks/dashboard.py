"""The Grafana dashboard: every metric it queries is one Hotseat exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from deploy.checks.hotseat import exported_metrics
from deploy.checks.report import Report

REQUIRED_PANELS = ("outcome", "hold", "swap", "busy skip", "residency")
"""Words that some panel title must contain."""


def queried_metrics(expr: str) -> set[str]:
    """The Hotseat metric names a PromQL expression reads."""
    return set(re.findall(r"\bhotseat_[a-zA-Z0-9_]+", expr))


def queries(dashboard: dict[str, Any]) -> list[str]:
    targets = [
        target["expr"]
        for panel in dashboard.get("panels", [])
        for target in panel.get("targets", [])
    ]
    variables = dashboard.get("templating", {}).get("list", [])
    return targets + [v["query"] for v in variables if v.get("type") == "query"]


def check_dashboard(report: Report, path: Path) -> None:
    where = path.name
    try:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        report.fail(where, f"not JSON: {exc}")
        return
    exprs = queries(dashboard)
    if not exprs:
        report.fail(where, "no queries")
    known = exported_metrics()
    for expr in exprs:
        for name in sorted(queried_metrics(expr) - known):
            report.fail(where, f"{name} is not a Hotseat metric (in {expr!r})")
    titles = " | ".join(p.get("title", "").lower() for p in dashboard.get("panels", []))
    for wanted in REQUIRED_PANELS:
        if wanted not in titles:
            report.fail(where, f"no panel about {wanted}")
    report.ok(f"dashboard: {len(exprs)} queries")
