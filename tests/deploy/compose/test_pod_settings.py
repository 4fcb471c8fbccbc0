"""The Hotseat image under the security settings of the Kubernetes manifests
(deploy/kubernetes/base): the router, the controller and the audit service, each started
by testcontainers from the image with its Deployment's user and group, a read-only root
filesystem, no capabilities, no privilege escalation and an empty /tmp, join the compose
stack as one more replica, serve, and exit 0 on SIGTERM.

No cluster runs here: this is how far the manifests are exercised for real."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from testcontainers.core.container import DockerContainer

from hotseat.launcher import free_port
from tests.deploy.compose.conftest import POLL_S, ROOT, Stack

pytestmark = pytest.mark.timeout(300)

MANIFESTS = ROOT / "deploy/kubernetes/base"
STOP_GRACE_S = 45  # the Deployments' terminationGracePeriodSeconds


def deployment(name: str) -> dict[str, Any]:
    documents = yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text(encoding="utf-8"))
    (found,) = [d for d in documents if d and d["kind"] == "Deployment"]
    spec: dict[str, Any] = found["spec"]["template"]["spec"]
    return spec


def pod_container(name: str, stack: Stack, port: int) -> DockerContainer:
    """The Deployment's container as `docker run` flags, on 127.0.0.1:``port``."""
    pod = deployment(name)
    (container,) = pod["containers"]
    pod_security, security = pod["securityContext"], container["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    tmpfs = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs]
    (config,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/hotseat"]
    assert config["readOnly"] is True
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(
        HOTSEAT_HOST="127.0.0.1",
        HOTSEAT_PORT=str(port),
        HOTSEAT_NATS_URL=stack.nats,
        HOTSEAT_REDIS_URL=stack.redis,
        HOTSEAT_AUDIT_DSN=stack.postgres,
        HOTSEAT_INSTANCE=f"{name}-pod-settings",
    )
    result = (
        DockerContainer(stack.image)
        .with_command(container["command"])
        .with_volume_mapping(
            stack.config_dir, config["mountPath"], "ro" if config["readOnly"] else "rw"
        )
        .with_kwargs(
            network_mode="host",
            user=f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}",
            read_only=security["readOnlyRootFilesystem"],
            cap_drop=security["capabilities"]["drop"],
            security_opt=[] if security["allowPrivilegeEscalation"] else ["no-new-privileges"],
        )
    )
    for path in tmpfs:
        result = result.with_tmpfs_mount(path)
    for key, value in env.items():
        result = result.with_env(key, value)
    return result


def wait_ready(container: DockerContainer, url: str) -> None:
    """Until ``/readyz`` answers 200; fails at once if the container exits first."""
    wrapped = container.get_wrapped_container()
    while True:
        wrapped.reload()
        assert wrapped.status == "running", container.get_logs()
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)  # the poll interval: readiness inside a container announces nothing


@pytest.fixture(params=["router", "controller", "audit"])
def replica(
    request: pytest.FixtureRequest, stack: Stack
) -> Iterator[tuple[str, str, DockerContainer]]:
    name: str = request.param
    port = free_port()
    with pod_container(name, stack, port) as container:
        url = f"http://127.0.0.1:{port}"
        wait_ready(container, url)
        yield name, url, container


def test_service_runs_under_the_manifests_security_settings(
    replica: tuple[str, str, DockerContainer],
) -> None:
    """Read-only root, uid 10001, no capabilities: the service serves, then exits 0 on
    SIGTERM within the pod's grace period."""
    name, url, container = replica
    if name == "router":
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "coder",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
            },
            timeout=120,
        )
        assert response.status_code == 200, response.text
    elif name == "controller":
        pools = httpx.get(f"{url}/v1/pools", timeout=10).json()["pools"]
        assert [p["name"] for p in pools] == ["gpu0"]
    else:
        assert httpx.get(f"{url}/v1/events", params={"limit": 1}, timeout=10).status_code == 200
    wrapped = container.get_wrapped_container()
    assert wrapped.attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert wrapped.attrs["Config"]["User"] == "10001:10001"
    wrapped.stop(timeout=STOP_GRACE_S)
    assert wrapped.wait(timeout=STOP_GRACE_S)["StatusCode"] == 0, container.get_logs()
