"""The kubernetes driver against a real HTTP server speaking the Kubernetes API (kube_api.py):
the exact requests it sends, and that a member's pods are gone before the next scales up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hotseat_common.config.model import HotseatConfig
from hotseat_pool_controller.drivers import build_driver
from hotseat_pool_controller.drivers.base import DriverError, Fenced
from hotseat_pool_controller.drivers.kubernetes import (
    EPOCH_ANNOTATION,
    WATCH_SERVER_TIMEOUT_S,
    KubernetesDriver,
)
from tests.controller.kube_api import KubeApi, slots_server
from tests.support.stack import Stack

pytestmark = pytest.mark.timeout(60)

DEPLOY = "/apis/apps/v1/namespaces/llm/deployments/{}"
STS = "/apis/apps/v1/namespaces/llm/statefulsets/{}"
PODS = "/api/v1/namespaces/llm/pods"
MERGE_PATCH = "application/merge-patch+json"


def pool_config(
    kubeconfig: Path, members: dict[str, dict[str, Any]], **driver: Any
) -> HotseatConfig:
    return HotseatConfig.model_validate(
        {
            "pools": [
                {
                    "name": "gpu0",
                    "driver": {
                        "kind": "kubernetes",
                        "namespace": "llm",
                        "kubeconfig": str(kubeconfig),
                        "requestTimeout": "5s",
                        **driver,
                    },
                    "members": [
                        {"name": name, "kubernetes": spec} for name, spec in members.items()
                    ],
                }
            ]
        }
    )


@pytest.fixture
async def api() -> AsyncIterator[KubeApi]:
    async with KubeApi() as server:
        yield server


@pytest.fixture
async def make_driver(
    api: KubeApi, tmp_path: Path
) -> AsyncIterator[Callable[..., KubernetesDriver]]:
    drivers: list[KubernetesDriver] = []

    def make(
        members: dict[str, dict[str, Any]] | None = None, token: str | None = None, **driver: Any
    ) -> KubernetesDriver:
        kubeconfig = tmp_path / f"kubeconfig-{len(drivers)}"
        kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(token)))
        config = pool_config(
            kubeconfig, members or {"a": {"name": "a"}, "b": {"name": "b"}}, **driver
        )
        built = build_driver(config, config.pools[0])
        assert isinstance(built, KubernetesDriver)
        built.poll_interval_s = 0.02
        drivers.append(built)
        return built

    yield make
    for made in drivers:
        await made.aclose()


@pytest.fixture
def driver(make_driver: Callable[..., KubernetesDriver]) -> KubernetesDriver:
    return make_driver()


def watch_query(version: str, selector: str = "app=a") -> dict[str, str]:
    return {
        "timeoutSeconds": str(WATCH_SERVER_TIMEOUT_S),
        "resourceVersion": version,
        "labelSelector": selector,
        "watch": "true",
    }


# --- load ---------------------------------------------------------------------------


async def test_load_merge_patches_the_scale_to_one_and_returns_once_available(
    api: KubeApi, driver: KubernetesDriver
):
    """load: GET the Deployment, record the epoch on it and PATCH /scale (merge patches,
    each conditional on the version it was computed from), GET until available."""
    version = str(api.add_workload("a", replicas=0).resource_version)
    await driver.load("a", epoch=1)

    assert api.workload("a").available == 1
    assert api.calls() == [
        ("GET", DEPLOY.format("a"), {}),
        ("PATCH", DEPLOY.format("a"), {"fieldManager": "hotseat-controller"}),
        ("PATCH", DEPLOY.format("a") + "/scale", {"fieldManager": "hotseat-controller"}),
        ("GET", DEPLOY.format("a"), {}),
    ]
    annotate, patch = (r for r in api.requests if r.method == "PATCH")
    assert {annotate.content_type, patch.content_type} == {MERGE_PATCH}
    assert annotate.body == {
        "metadata": {"resourceVersion": version, "annotations": {EPOCH_ANNOTATION: "1"}}
    }
    assert patch.body["spec"] == {"replicas": 1}
    assert patch.body["metadata"]["resourceVersion"] != version  # the annotated one
    # It polled while the pod was pending, and stopped at the first available answer.
    assert sum(r.method == "GET" for r in api.requests) >= 3
    assert api.requests[-1].method == "GET"


async def test_load_of_an_available_member_only_reads_it(api: KubeApi, driver: KubernetesDriver):
    """load is idempotent: an available workload at 1 replica gets one GET and no PATCH."""
    api.add_workload("a", replicas=1)
    await driver.load("a", epoch=1)
    assert api.calls(skip_repeats=False) == [("GET", DEPLOY.format("a"), {})]


async def test_load_fails_fast_when_the_rollout_is_stuck(api: KubeApi, driver: KubernetesDriver):
    """A Deployment reporting ProgressDeadlineExceeded fails the load with its message."""
    workload = api.add_workload("a", replicas=1)
    workload.available = 0
    workload.conditions = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "a-5d8" has timed out progressing.',
        }
    ]
    with pytest.raises(DriverError, match=r"ProgressDeadlineExceeded.*timed out progressing"):
        await driver.load("a", epoch=1)


async def test_a_stale_rollout_failure_does_not_fail_a_new_scale_up(
    api: KubeApi, driver: KubernetesDriver
):
    """A failure condition from an earlier rollout, still shown while the Deployment
    controller has not observed this scale-up (observedGeneration behind generation), is
    not taken as this load's failure."""
    workload = api.add_workload("a", replicas=0)
    stale = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": "an earlier rollout timed out"}
    ]  # fmt: skip
    workload.conditions = stale
    observed: list[bool] = []
    original = workload.body

    def lagging() -> dict[str, Any]:
        body = original()
        caught_up = len(observed) >= 3 or workload.available == 1
        observed.append(caught_up)
        if not caught_up:
            body["status"]["observedGeneration"] = workload.generation - 1
            body["status"]["conditions"] = stale
        return body

    workload.body = lagging  # type: ignore[method-assign]
    await driver.load("a", epoch=2)
    assert workload.available == 1
    assert observed[:2] == [False, False]  # the stale failure was seen, and ignored


async def test_missing_workload_is_a_driver_error_naming_it(api: KubeApi, driver: KubernetesDriver):
    """A 404 from the API becomes a DriverError that names the workload and the reason."""
    with pytest.raises(DriverError, match=r'deployment llm/a: HTTP 404 NotFound: .*"a" not found'):
        await driver.load("a", epoch=1)


async def test_statefulset_members_use_the_statefulset_paths(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
):
    """A StatefulSet member is read and scaled under /statefulsets, in its own namespace."""
    api.add_workload("big", plural="statefulsets", replicas=0)
    driver = make_driver(
        {"a": {"name": "big", "workload": "StatefulSet", "namespace": "llm"}}, namespace="other"
    )
    await driver.load("a", epoch=3)
    assert api.calls()[:3] == [
        ("GET", STS.format("big"), {}),
        ("PATCH", STS.format("big"), {"fieldManager": "hotseat-controller"}),
        ("PATCH", STS.format("big") + "/scale", {"fieldManager": "hotseat-controller"}),
    ]
    await driver.unload("a", epoch=4)
    assert api.pods_of(api.workload("big", "statefulsets")) == []


# --- unload ---------------------------------------------------------------------------


async def test_unload_returns_only_after_the_pods_are_deleted(
    api: KubeApi, driver: KubernetesDriver
):
    """unload: PATCH /scale to 0, list the selector's pods, watch from the list's version
    until every pod is DELETED (a terminating pod still holds the GPU)."""
    workload = api.add_workload("a", replicas=1)
    assert len(api.pods_of(workload)) == 1

    await driver.unload("a", epoch=2)

    assert api.pods_of(workload) == []
    deleted = api.moments("pod_deleted")
    assert len(deleted) == 1
    calls = api.calls()
    assert calls[:4] == [
        ("GET", DEPLOY.format("a"), {}),
        ("PATCH", DEPLOY.format("a"), {"fieldManager": "hotseat-controller"}),
        ("PATCH", DEPLOY.format("a") + "/scale", {"fieldManager": "hotseat-controller"}),
        ("GET", PODS, {"labelSelector": "app=a"}),
    ]
    patch = api.requests[2]
    assert patch.content_type == MERGE_PATCH
    assert patch.body["spec"] == {"replicas": 0}
    method, path, query = calls[4]
    assert (method, path) == ("GET", PODS)
    assert query == watch_query(query["resourceVersion"])
    assert len(calls) == 5


async def test_unload_of_a_scaled_down_member_is_one_read_and_one_list(
    api: KubeApi, driver: KubernetesDriver
):
    """unload is idempotent and cheap: replicas 0 and no pods means GET + LIST, no PATCH."""
    api.add_workload("a", replicas=0)
    await driver.unload("a", epoch=2)
    assert api.calls(skip_repeats=False) == [
        ("GET", DEPLOY.format("a"), {}),
        ("GET", PODS, {"labelSelector": "app=a"}),
    ]


async def test_unload_waits_for_pods_still_terminating_after_an_earlier_scale_down(
    api: KubeApi, driver: KubernetesDriver
):
    """A workload already at 0 whose pod is still terminating: no PATCH, but unload waits."""
    workload = api.add_workload("a", replicas=1)
    workload.replicas = 0  # scaled down by someone else a moment ago
    api._spawn(api._reconcile(workload))
    await asyncio.sleep(0)  # one loop turn: the reconcile marks the pod (no wall time)
    assert api.pods_of(workload)  # terminating, still there

    await driver.unload("a", epoch=2)

    assert api.pods_of(workload) == []
    assert [(m, p, "watch" in q) for m, p, q in api.calls()] == [
        ("GET", DEPLOY.format("a"), False),
        ("GET", PODS, False),
        ("GET", PODS, True),
    ]


async def test_unload_lists_again_when_the_watch_history_expired(
    api: KubeApi, driver: KubernetesDriver
):
    """A 410 Gone watch event (history compacted) makes unload list again, then watch."""
    workload = api.add_workload("a", replicas=1)
    api.expire_watches = 1

    await driver.unload("a", epoch=2)

    assert api.pods_of(workload) == []
    pods_calls = [("watch" in q) for _, p, q in api.calls(skip_repeats=False) if p == PODS]
    assert pods_calls == [False, True, False, True]  # list, watch (410), list, watch


async def test_unload_fails_when_the_api_server_is_down(api: KubeApi, driver: KubernetesDriver):
    """An API answer that is not a success is a DriverError: never "gone" on a guess."""
    api.add_workload("a", replicas=1)
    api.down = True
    with pytest.raises(DriverError, match="HTTP 503"):
        await driver.unload("a", epoch=2)


# --- idle, ready, residency -------------------------------------------------------------


async def test_is_idle_asks_every_pod_slots_and_fails_closed(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
):
    """is_idle: list the pods by selector, GET each pod IP's /slots; unsure is an error."""
    state: dict[str, bool] = {"busy": False}
    async with slots_server(state) as port:
        api.add_workload("a", replicas=1, port=port)
        driver = make_driver()
        assert await driver.is_idle("a") is True
        assert api.calls() == [
            ("GET", DEPLOY.format("a"), {}),
            ("GET", PODS, {"labelSelector": "app=a"}),
        ]
        state["busy"] = True
        assert await driver.is_idle("a") is False
        state["broken"] = True
        with pytest.raises(DriverError, match="cannot tell whether idle"):
            await driver.is_idle("a")
    with pytest.raises(DriverError, match="cannot tell whether idle"):
        await driver.is_idle("a")  # the pod's server is gone: unsure, not idle


async def test_is_idle_uses_slots_port_and_counts_a_workload_without_pods_as_idle(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
):
    """slotsPort overrides the pod's declared port; no pods at all means idle."""
    state: dict[str, bool] = {"busy": True}
    async with slots_server(state) as port:
        api.add_workload("a", replicas=1, port=None)
        api.add_workload("b", replicas=0)
        driver = make_driver({"a": {"name": "a", "slotsPort": port}, "b": {"name": "b"}})
        assert await driver.is_idle("a") is False
        assert await driver.is_idle("b") is True


async def test_is_idle_without_any_port_to_ask_is_an_error(api: KubeApi, driver: KubernetesDriver):
    """A pod that declares no container port and no slotsPort: the driver cannot tell."""
    api.add_workload("a", replicas=1, port=None)
    with pytest.raises(DriverError, match="slotsPort"):
        await driver.is_idle("a")


async def test_is_ready_reads_available_replicas(api: KubeApi, driver: KubernetesDriver):
    """is_ready: replicas >= 1 and availableReplicas >= 1; false when the API is down."""
    api.add_workload("a", replicas=1)
    api.add_workload("b", replicas=0)
    assert await driver.is_ready("a") is True
    assert await driver.is_ready("b") is False
    api.down = True
    assert await driver.is_ready("a") is False


async def test_residency_reads_the_scale_subresource_and_counts_unknown_as_loaded(
    api: KubeApi, driver: KubernetesDriver
):
    """residency: GET .../scale per member; a member the API cannot answer for is loaded."""
    api.add_workload("a", replicas=1)
    api.add_workload("b", replicas=0)
    assert await driver.residency() == {"a": True, "b": False}
    assert api.calls() == [
        ("GET", DEPLOY.format("a") + "/scale", {}),
        ("GET", DEPLOY.format("b") + "/scale", {}),
    ]
    api.down = True
    assert await driver.residency() == {"a": True, "b": True}


async def test_bearer_token_from_the_kubeconfig_is_sent(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
):
    """The kubeconfig's user token authenticates every call; a wrong one is a DriverError."""
    api.add_workload("a", replicas=1)
    api.token = "s3cret"
    good = make_driver(token="s3cret")
    bad = make_driver(token="wrong")
    assert await good.residency() == {"a": True, "b": True}  # b does not exist: unknown
    assert all(r.path.endswith("/scale") for r in api.requests)
    with pytest.raises(DriverError, match="HTTP 401"):
        await bad.load("a", epoch=1)


def test_missing_kubeconfig_is_a_driver_error_at_start(tmp_path: Path):
    """Without API access the driver refuses to start, saying why."""
    config = pool_config(tmp_path / "absent", {"a": {"name": "a"}})
    with pytest.raises(DriverError, match="no Kubernetes API access"):
        build_driver(config, config.pools[0])


# --- the ordering guarantee ---------------------------------------------------------------


async def test_swap_sequence_deletes_old_pods_before_the_next_member_scales_up(
    api: KubeApi, driver: KubernetesDriver
):
    """The swap's driver sequence (unload every other member, then load the target): the
    PATCH that scales b up arrives only after a's pod was deleted."""
    api.termination_s = 0.5  # long enough that scaling b early would be caught
    api.add_workload("a", replicas=1)
    api.add_workload("b", replicas=0)

    await asyncio.gather(driver.unload("a", epoch=7))  # as SwapRunner._unload_others does
    await driver.load("b", epoch=7)

    deleted = api.moments("pod_deleted")
    scale_b = [m for m in api.moments("scale") if m.name == "b" and m.detail == 1]
    assert len(deleted) == 1
    assert deleted[0].name == "a"
    assert len(scale_b) == 1
    assert deleted[0].at < scale_b[0].at
    assert api.workload("b").available == 1


async def test_controller_swap_deletes_old_pods_before_the_next_member_scales_up(
    api: KubeApi, make_stack: Callable[[dict[str, Any]], Stack], tmp_path: Path
):
    """A real controller (SwapRunner) warms the default member a, then a forced swap to b
    scales a to 0, waits until its pod is deleted, and only then scales b up."""
    api.termination_s = 0.5
    api.add_workload("a")
    api.add_workload("b")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig()))
    config = pool_config(kubeconfig, {"a": {"name": "a"}, "b": {"name": "b"}})
    document = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    document["pools"][0]["default"] = "a"
    stack = make_stack(document)
    await asyncio.to_thread(stack.start_controller)

    await stack.wait_resident("a")
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.post(
            f"{stack.controller_url}/v1/pools/gpu0/swap",
            json={"member": "b"},
            headers={"Authorization": f"Bearer {stack.admin_token}"},
        )
    assert response.status_code < 300, response.text
    await stack.wait_resident("b")

    scales = [(m.name, m.detail) for m in api.moments("scale")]
    assert scales == [("a", 1), ("a", 0), ("b", 1)], stack.logs()
    deleted = api.moments("pod_deleted")
    scale_b = next(m for m in api.moments("scale") if m.name == "b")
    assert [m.name for m in deleted] == ["a"]
    assert deleted[0].at < scale_b.at
    assert api.workload("b").available == 1
    assert api.pods_of(api.workload("a")) == []


def _rbac_verbs(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) of one API request, as the API server authorizes it."""
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2 :]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    if method == "PATCH":
        return group, resource, "patch"
    if len(rest) == 1:
        return group, resource, "watch" if query.get("watch") == "true" else "list"
    return group, resource, "get"


async def test_shipped_role_grants_exactly_the_verbs_the_driver_uses(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
):
    """deploy/kubernetes/base/rbac.yaml is least privilege: every request of a full driver
    cycle is allowed by the Role, and the Role allows nothing the driver never does."""
    state: dict[str, bool] = {"busy": False}
    async with slots_server(state) as port:
        api.add_workload("model-assistant", replicas=1, port=port)
        api.add_workload("model-coder", replicas=0, port=port)
        driver = make_driver({"a": {"name": "model-assistant"}, "b": {"name": "model-coder"}})
        await driver.residency()
        assert await driver.is_ready("a")
        assert await driver.is_idle("a")
        await driver.unload("a", epoch=1)
        await driver.load("b", epoch=1)
    used = {_rbac_verbs(r.method, r.path, r.query) for r in api.requests}

    rbac = Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/rbac.yaml"
    role = next(d for d in yaml.safe_load_all(rbac.read_text()) if d["kind"] == "Role")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert used == granted
    names = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert names == {"model-assistant", "model-coder"}


# --- fencing ---------------------------------------------------------------------------


async def test_a_stale_owner_cannot_scale_a_member_a_newer_owner_scaled(
    api: KubeApi, make_driver: Callable[..., KubernetesDriver]
) -> None:
    """The epoch goes onto the workload before each scale, and every write is conditional
    on the version read: a controller of an older epoch (frozen past its heartbeat, thawed
    after another took the pool) is refused, whether it reads after the newer write or
    read before it (the API server's 409, then the fence); the member stays up."""
    api.add_workload("a", replicas=0)
    newer, stale = make_driver(), make_driver()
    read_before = await stale._workload(stale._spec("a"))
    await newer.load("a", epoch=7)
    assert api.workload("a").annotations == {EPOCH_ANNOTATION: "7"}
    with pytest.raises(Fenced):
        await stale.unload("a", epoch=5)
    with pytest.raises(Fenced):
        await stale._scale(stale._spec("a"), 0, 6, read_before)
    conflicts = [r for r in api.requests if r.method == "PATCH" and r.body["metadata"].get(
        "resourceVersion") == read_before.metadata.resourceVersion]  # fmt: skip
    assert conflicts, "the stale write was sent on the version it had read"
    assert api.workload("a").replicas == 1
    assert [m.detail for m in api.moments("scale")] == [1]
    await newer.unload("a", epoch=8)
    assert api.workload("a").replicas == 0
