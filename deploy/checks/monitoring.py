"""compose.yaml's Prometheus and Grafana: what neither the Compose schema nor Grafana's own
start-up would tell before someone opens an empty dashboard.

- Prometheus: its mounted config parses; every scrape target is a Hotseat service of the
  project on the port it listens on; every router, controller and audit service is
  scraped.
- Grafana: the provisioned data source points at the Prometheus service's port; the
  dashboard provider's path holds the shipped dashboard (mounted from the file the
  dashboard check reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from deploy.checks.compose import load, plain
from deploy.checks.report import Report

PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
PROMETHEUS_PORT = 9090
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
DASHBOARD = "deploy/kubernetes/monitoring/grafana-dashboard.json"
SCRAPED = ("hotseat-router", "hotseat-controller", "hotseat-audit")
"""Entry points whose /metrics Prometheus must scrape."""


def _bind_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Container path -> repository path of the service's bind mounts (``./...``)."""
    mounts: dict[str, str] = {}
    for mount in service.get("volumes", []):
        if isinstance(mount, str) and mount.startswith("./"):
            source, target = mount.split(":")[:2]
            mounts[target] = source.removeprefix("./")
    return mounts


def _listens(service: Mapping[str, Any]) -> str | None:
    """The port a Hotseat service listens on (``--port``, else ``HOTSEAT_PORT``)."""
    command = service.get("command")
    if isinstance(command, list) and "--port" in command:
        return str(command[command.index("--port") + 1])
    port = (service.get("environment") or {}).get("HOTSEAT_PORT")
    return None if port is None else str(port)


def _entry_point(service: Mapping[str, Any]) -> str:
    command = service.get("command")
    return str(command[0]) if isinstance(command, list) and command else ""


def _read_yaml(report: Report, root: Path, where: str) -> Any:
    path = root / where
    if not path.is_file():
        report.fail(where, "does not exist")
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        report.fail(where, f"not YAML: {exc}")
        return None


def check_monitoring(report: Report, root: Path) -> None:
    services: dict[str, Any] = plain(load(root / "compose.yaml")).get("services", {})
    prometheus, grafana = services.get("prometheus"), services.get("grafana")
    if prometheus is None or grafana is None:
        report.fail("compose.yaml", "has no prometheus or no grafana service")
        return
    targets = _check_prometheus(report, root, services, prometheus)
    _check_grafana(report, root, grafana)
    report.ok(f"monitoring: {targets} scrape targets, Grafana provisioned")


def _check_prometheus(
    report: Report, root: Path, services: Mapping[str, Any], prometheus: Mapping[str, Any]
) -> int:
    where = _bind_mounts(prometheus).get(PROMETHEUS_CONFIG)
    if where is None:
        report.fail("compose.yaml: services.prometheus", f"mounts nothing at {PROMETHEUS_CONFIG}")
        return 0
    config = _read_yaml(report, root, where)
    if not isinstance(config, dict):
        return 0
    targets = [
        str(target)
        for job in config.get("scrape_configs") or []
        for static in job.get("static_configs") or []
        for target in static.get("targets") or []
    ]
    scraped: set[str] = set()
    for target in targets:
        host, _, port = target.partition(":")
        service = services.get(host)
        if service is None:
            report.fail(where, f"target {target}: {host} is not a compose service")
        elif not _entry_point(service).startswith("hotseat-"):
            report.fail(where, f"target {target}: {host} is not a Hotseat service")
        elif _listens(service) != port:
            report.fail(where, f"target {target}: {host} listens on {_listens(service)}")
        else:
            scraped.add(host)
    for name, service in services.items():
        if _entry_point(service) in SCRAPED and name not in scraped:
            report.fail(where, f"service {name} is not scraped")
    return len(targets)


def _check_grafana(report: Report, root: Path, grafana: Mapping[str, Any]) -> None:
    mounts = _bind_mounts(grafana)
    provisioning = mounts.get(GRAFANA_PROVISIONING)
    if provisioning is None:
        report.fail("compose.yaml: services.grafana", f"mounts nothing at {GRAFANA_PROVISIONING}")
        return
    sources = sorted((root / provisioning / "datasources").glob("*.yaml"))
    urls = []
    for path in sources:
        document = _read_yaml(report, root, str(path.relative_to(root))) or {}
        urls += [s.get("url", "") for s in document.get("datasources") or []]
    if not urls:
        report.fail(provisioning, "provisions no data source")
    for url in urls:
        parts = urlsplit(url)
        if (parts.hostname, parts.port) != ("prometheus", PROMETHEUS_PORT):
            report.fail(provisioning, f"data source {url} is not the prometheus service")
    providers = []
    for path in sorted((root / provisioning / "dashboards").glob("*.yaml")):
        document = _read_yaml(report, root, str(path.relative_to(root))) or {}
        providers += [p.get("options", {}).get("path", "") for p in document.get("providers") or []]
    if not providers:
        report.fail(provisioning, "provisions no dashboard provider")
    for directory in providers:
        shipped = [t for t, s in mounts.items() if s == DASHBOARD and t.startswith(directory + "/")]
        if not shipped:
            report.fail(provisioning, f"dashboard path {directory} holds no mount of {DASHBOARD}")
