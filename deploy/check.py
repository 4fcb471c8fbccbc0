"""Validate Hotseat's deploy files offline: ``python -m deploy.check`` (``make deploy-check``).

No Docker engine and no cluster needed:

- Compose (:mod:`deploy.checks.compose`): ``compose.yaml`` alone and with
  ``compose.gpu.yaml``, against the Compose Specification schema and for cross-references
  (services, health checks, files, images, the Hotseat config they mount), plus nginx.
- The Dockerfile (:mod:`deploy.checks.dockerfile`).
- Kubernetes (:mod:`deploy.checks.kubernetes`): each overlay rendered like ``kustomize
  build`` (:mod:`deploy.kustomize`), every object against the Kubernetes schemas, and
  cross-references including the driver's RBAC.
- The Grafana dashboard (:mod:`deploy.checks.dashboard`), and compose.yaml's Prometheus
  and Grafana that show it (:mod:`deploy.checks.monitoring`).

Prints one line per check and per problem; exit status 1 when there is a problem.
"""

from __future__ import annotations

import sys
from pathlib import Path

from deploy.checks.compose import check_nginx, check_project
from deploy.checks.dashboard import check_dashboard
from deploy.checks.dockerfile import check_dockerfile
from deploy.checks.kubernetes import check_overlay
from deploy.checks.monitoring import check_monitoring
from deploy.checks.report import Report

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_PROJECTS = (("compose.yaml",), ("compose.yaml", "compose.gpu.yaml"))
"""Each project: its files, later ones overriding the first (``docker compose -f -f``)."""


def check_all(root: Path = ROOT) -> Report:
    report = Report()
    for files in COMPOSE_PROJECTS:
        check_project(report, root, files)
    check_nginx(report, root)
    check_dockerfile(report, root)
    for overlay in sorted((root / "deploy/kubernetes/overlays").iterdir()):
        check_overlay(report, root, overlay)
    check_dashboard(report, root / "deploy/kubernetes/monitoring/grafana-dashboard.json")
    check_monitoring(report, root)
    return report


def main() -> int:
    report = check_all()
    out = sys.stdout
    for line in report.checked:
        out.write(f"ok    {line}\n")
    for line in report.problems:
        out.write(f"FAIL  {line}\n")
    out.write(f"deploy-check: {len(report.checked)} checked, {len(report.problems)} problem(s)\n")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
