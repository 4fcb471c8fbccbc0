"""compose.gpu.yaml as Docker Compose v2 itself reads it over compose.yaml (``docker
compose config``): no GPU here to run it, so this is what is checked of it beyond
``make deploy-check``."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.deploy.compose.conftest import ROOT

pytestmark = pytest.mark.timeout(120)

GPU_CONFIG = "deploy/compose/hotseat.gpu.yaml"


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    """The merged project, as `up` would start it (no profile asked for)."""
    out = subprocess.run(
        ["docker", "compose", "--file=compose.yaml", "--file=compose.gpu.yaml", "config",
         "--format=json"],
        cwd=ROOT, env={**os.environ, "HOTSEAT_MODELS": str(ROOT / "examples")},
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    merged: dict[str, Any] = json.loads(out)
    return merged


def test_gpu_override_leaves_out_the_sims_and_the_second_controller(
    project: dict[str, Any],
) -> None:
    """Only one controller runs a `process` pool, and no sim stands in for the GPU; the
    monitoring (Prometheus and Grafana) stays."""
    services = set(project["services"])
    assert services == {
        "nats", "redis", "postgres", "controller-1", "audit", "router-1", "router-2", "gateway",
        "prometheus", "grafana",
    }  # fmt: skip


def test_gpu_controller_gets_the_llama_image_and_the_gpu(project: dict[str, Any]) -> None:
    """controller-1 builds the controller-llama target, reserves one NVIDIA GPU, and waits
    only for NATS and Redis (`!override` drops the sims from its dependencies)."""
    controller = project["services"]["controller-1"]
    assert controller["build"]["target"] == "controller-llama"
    (device,) = controller["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", 1, ["gpu"])
    assert set(controller["depends_on"]) == {"nats", "redis"}


def test_every_hotseat_service_reads_the_gpu_config(project: dict[str, Any]) -> None:
    """Routers, the controller and audit all mount deploy/compose/hotseat.gpu.yaml."""
    for name in ("controller-1", "audit", "router-1", "router-2"):
        mounts = {
            m["target"]: m["source"]
            for m in project["services"][name]["volumes"]
            if m["type"] == "bind"
        }
        assert mounts["/etc/hotseat/hotseat.yaml"] == str(ROOT / GPU_CONFIG.removeprefix("./")), (
            name
        )
