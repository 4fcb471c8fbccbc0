"""What the deploy files must agree with: Hotseat's entry points, config and metrics."""

from __future__ import annotations

import tomllib
from pathlib import Path

from prometheus_client import CollectorRegistry

from deploy.checks.report import Report
from hotseat_common import metrics
from hotseat_common.config import ConfigError, HotseatConfig, load_config

PYPROJECTS = ("pyproject.toml", "libs/*/pyproject.toml", "services/*/pyproject.toml")


def entry_points(root: Path) -> set[str]:
    """Every console script Hotseat's packages install."""
    names: set[str] = set()
    for pattern in PYPROJECTS:
        for path in root.glob(pattern):
            project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
            names.update(project.get("scripts", {}))
    return names


def load_hotseat_config(report: Report, where: str, path: Path) -> HotseatConfig | None:
    """The config at ``path`` as ``hotseat check-config`` reads it; problems reported."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for issue in exc.issues:
            report.fail(where, f"{path.name}: {issue}")
    except OSError as exc:
        report.fail(where, f"cannot read {path}: {exc}")
    return None


def exported_metrics() -> set[str]:
    """Every sample name Hotseat's services export (histograms with their suffixes)."""
    names: set[str] = set()
    for build in (metrics.RouterMetrics, metrics.PoolMetrics, metrics.AuditMetrics):
        registry = CollectorRegistry()
        build(registry)
        for family in registry.collect():
            if family.type == "histogram":
                names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
            elif family.type == "counter":
                names.add(f"{family.name}_total")
            else:
                names.add(family.name)
    return names
