"""The ``kubernetes`` driver: a member is a Deployment or StatefulSet scaled between 0 and 1.

Every call goes to the Kubernetes API (lightkube, in-cluster service account or a
kubeconfig), bounded by the driver's ``requestTimeout``:

- **load**: read the workload; unless ``spec.replicas`` is 1 already, merge-patch its
  ``scale`` subresource to 1; then poll the workload until ``status.availableReplicas``
  reaches 1. A Deployment whose rollout reports ``ProgressDeadlineExceeded`` or a
  ``ReplicaFailure`` fails the load at once instead of waiting for the swap's deadline.
- **unload**: read the workload (its ``spec.selector`` names its pods); unless
  ``spec.replicas`` is 0 already, merge-patch ``scale`` to 0; then list the pods that the
  selector matches and **watch them until every one is deleted**. A terminating pod still
  holds the GPU, so "scaled to 0" is not "gone": only the pods' ``DELETED`` events are.
  This is what keeps "never two residents" true across a swap: the controller loads the
  next member only after ``unload`` returns.
- **is_ready**: ``spec.replicas >= 1`` and ``status.availableReplicas >= 1`` (the pod's
  own readiness probe decides availability); false when the API cannot be read.
- **is_idle**: every pod of the workload that has an IP answers its llama.cpp-style
  ``/slots`` (port: the member's ``slotsPort``, else the container port named ``http``,
  else the first declared) with no slot processing. Any pod that cannot be asked, or a
  malformed answer, raises :class:`DriverError`: the controller then counts the member as
  busy (fail closed). A workload without pods is idle.
- **residency**: ``spec.replicas`` or ``status.replicas`` of the ``scale`` subresource is
  above 0; a workload that cannot be read counts as loaded (it might hold the GPU).

Fencing: every scale is preceded by a merge patch that records the swap's epoch in the
workload's ``hotseat.dev/epoch`` annotation, and both patches carry the
``metadata.resourceVersion`` they were computed from, so the API server refuses (409
Conflict) a write based on a version someone changed since. A controller whose epoch is
older than the one recorded (it lost the swap while frozen) refuses to scale; one whose
read raced a newer owner's write is refused by the API server, reads again, and then
refuses. A conflict with an unrelated writer (a rollout) is simply retried.

The controller's service account needs ``get`` and ``patch`` on the workloads and their
``scale`` subresource, and ``get``, ``list``, ``watch`` on pods (deploy/kubernetes/).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_common.config.model import KubernetesDriver as KubernetesDriverConfig
from hotseat_common.logging import get_logger
from hotseat_pool_controller.drivers.base import DriverError, Fenced
from hotseat_pool_controller.drivers.probes import fetch_idle
from hotseat_pool_controller.drivers.workloads import (
    Selector,
    Workload,
    WorkloadSpec,
    available,
    container_port,
    pod_name,
    raise_if_failed,
    replica_count,
    selector_of,
)

__all__ = ["KubernetesDriver"]

log = get_logger(__name__)

EPOCH_ANNOTATION = "hotseat.dev/epoch"
"""The highest swap epoch that scaled the workload (see the fencing paragraph above)."""
CONFLICT_RETRIES = 5
HTTP_CONFLICT = 409

WATCH_SERVER_TIMEOUT_S = 60
"""A pod watch is re-opened (from the last resource version) at least this often."""


class KubernetesDriver:
    """Scales each member's workload between 0 and 1 replica; see the module docstring."""

    poll_interval_s = 0.25
    """How often a loading workload is read until it is available."""

    def __init__(self, config: HotseatConfig, pool: Pool) -> None:
        driver = pool.driver
        if not isinstance(driver, KubernetesDriverConfig):
            raise DriverError(f"pool {pool.name}: not a kubernetes pool")
        self._pool = pool.name
        self._specs: dict[str, WorkloadSpec] = {}
        for member in pool.members:
            workload = member.kubernetes
            if workload is None:
                raise DriverError(f"pool {pool.name}: member {member.name} has no kubernetes block")
            self._specs[member.name] = WorkloadSpec(
                member=member.name,
                kind=Deployment if workload.workload == "Deployment" else StatefulSet,
                name=workload.name,
                namespace=workload.namespace or driver.namespace,
                slots_port=workload.slots_port,
            )
        self._locks = {name: asyncio.Lock() for name in self._specs}
        try:
            kubeconfig = (
                KubeConfig.from_file(driver.kubeconfig)
                if driver.kubeconfig
                else KubeConfig.from_env()
            )
            cluster = kubeconfig.get(driver.context)
        except (ConfigError, OSError) as exc:
            raise DriverError(f"pool {pool.name}: no Kubernetes API access: {exc}") from exc
        if cluster is None:
            raise DriverError(f"pool {pool.name}: kubeconfig has no context {driver.context!r}")
        timeout = driver.request_timeout
        self._kube = AsyncClient(
            cluster,
            namespace=driver.namespace,
            timeout=httpx2.Timeout(timeout),
            field_manager="hotseat-controller",
        )
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            limits=httpx.Limits(max_connections=32),
        )

    # --- the ResidencyDriver interface ------------------------------------------------

    async def load(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            workload = await self._workload(spec)
            if replica_count(workload) != 1:
                workload = await self._scale(spec, 1, epoch, workload)
                log.info("kubernetes_scaled", pool=self._pool, member=member,
                         workload=spec.label, replicas=1, epoch=epoch)  # fmt: skip
            while not available(workload):
                await asyncio.sleep(self.poll_interval_s)
                workload = await self._workload(spec)
                raise_if_failed(spec, workload)

    async def unload(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            workload = await self._workload(spec)
            if replica_count(workload) != 0:
                workload = await self._scale(spec, 0, epoch, workload)
                log.info("kubernetes_scaled", pool=self._pool, member=member,
                         workload=spec.label, replicas=0, epoch=epoch)  # fmt: skip
            started = time.monotonic()
            await self._wait_pods_gone(spec, selector_of(spec, workload))
            log.info("kubernetes_pods_gone", pool=self._pool, member=member,
                     workload=spec.label, seconds=round(time.monotonic() - started, 3))  # fmt: skip

    async def is_ready(self, member: str) -> bool:
        spec = self._spec(member)
        try:
            workload = await self._workload(spec)
        except DriverError as exc:
            log.warning("kubernetes_ready_check_failed", pool=self._pool, member=member,
                        error=str(exc))  # fmt: skip
            return False
        return replica_count(workload) >= 1 and available(workload)

    async def fence(self, epoch: int) -> None:
        """Record ``epoch`` on every member's workload (conditional writes, as for a scale)."""
        for spec in self._specs.values():
            try:
                await self._record_epoch(spec, epoch)
            except DriverError as exc:
                log.warning("kubernetes_fence_failed", pool=self._pool, member=spec.member,
                            error=str(exc))  # fmt: skip

    async def _record_epoch(self, spec: WorkloadSpec, epoch: int) -> None:
        for _ in range(CONFLICT_RETRIES):
            workload = await self._workload(spec)
            metadata = workload.metadata
            recorded = int(((metadata.annotations if metadata else None) or {}).get(
                EPOCH_ANNOTATION, "0"))  # fmt: skip
            if recorded >= epoch:
                return
            body = {"metadata": {"resourceVersion": metadata.resourceVersion if metadata else None,
                                 "annotations": {EPOCH_ANNOTATION: str(epoch)}}}  # fmt: skip
            try:
                await self._patch(spec, spec.kind, body, "record the epoch on")
            except DriverError as exc:
                if _conflict(exc):
                    continue
                raise
            return

    async def confirm_gone(self, member: str) -> bool:
        """Gone when no pod of the workload is left (a pod that fails its probes is not)."""
        spec = self._spec(member)
        try:
            workload = await self._workload(spec)
            return not await self._pods(spec, selector_of(spec, workload))
        except DriverError as exc:
            log.warning("kubernetes_gone_check_failed", pool=self._pool, member=member,
                        error=str(exc))  # fmt: skip
            return False

    async def is_idle(self, member: str) -> bool:
        spec = self._spec(member)
        workload = await self._workload(spec)
        pods = await self._pods(spec, selector_of(spec, workload))
        urls = [url for pod in pods if (url := self._slots_url(spec, pod)) is not None]
        answers = await asyncio.gather(*(fetch_idle(self._http, member, url) for url in urls))
        return all(answers)

    async def residency(self) -> dict[str, bool]:
        """Loaded unless the scale subresource says 0 wanted and 0 running."""
        result: dict[str, bool] = {}
        for member, spec in self._specs.items():
            try:
                scale = await self._call(
                    spec, "read scale of", self._kube.get(spec.kind.Scale, spec.name,
                                                          namespace=spec.namespace)
                )  # fmt: skip
            except DriverError as exc:
                log.warning("kubernetes_residency_unknown", pool=self._pool, member=member,
                            error=str(exc))  # fmt: skip
                result[member] = True  # unknown: it might hold the GPU
                continue
            wanted = scale.spec.replicas if scale.spec is not None else None
            running = scale.status.replicas if scale.status is not None else None
            result[member] = bool(wanted) or bool(running)
        return result

    async def aclose(self) -> None:
        await self._kube.aclose()
        await self._http.aclose()

    # --- internals --------------------------------------------------------------------

    def _spec(self, member: str) -> WorkloadSpec:
        try:
            return self._specs[member]
        except KeyError:
            raise DriverError(f"pool {self._pool}: no member {member!r}") from None

    async def _call(self, spec: WorkloadSpec, action: str, call: Any) -> Any:
        """Await one API call, translating every client error into a DriverError."""
        try:
            return await call
        except ApiError as exc:
            status = exc.status
            raise DriverError(
                f"{spec.member}: {action} {spec.label}: HTTP {status.code} {status.reason}: "
                f"{status.message}"
            ) from exc
        except (httpx2.HTTPError, OSError) as exc:
            raise DriverError(
                f"{spec.member}: {action} {spec.label}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _workload(self, spec: WorkloadSpec) -> Workload:
        workload: Workload = await self._call(
            spec, "read", self._kube.get(spec.kind, spec.name, namespace=spec.namespace)
        )
        return workload

    async def _scale(
        self, spec: WorkloadSpec, replicas: int, epoch: int, workload: Workload
    ) -> Workload:
        """Record ``epoch`` on the workload, then scale it, each write conditional on the
        version it was computed from (see the module docstring); the workload as read."""
        for _ in range(CONFLICT_RETRIES):
            metadata = workload.metadata
            recorded = int(((metadata.annotations if metadata else None) or {}).get(
                EPOCH_ANNOTATION, "0"))  # fmt: skip
            if recorded > epoch:
                raise Fenced(
                    f"{spec.member}: scale {spec.label} to {replicas} refused: epoch {epoch} is "
                    f"older than epoch {recorded} that already scaled it (this controller "
                    "lost the swap)"
                )
            version = metadata.resourceVersion if metadata else None
            try:
                if recorded < epoch:
                    workload = await self._patch(
                        spec,
                        spec.kind,
                        {"metadata": {"resourceVersion": version,
                                      "annotations": {EPOCH_ANNOTATION: str(epoch)}}},
                        "record the epoch on",
                    )  # fmt: skip
                    version = workload.metadata.resourceVersion if workload.metadata else None
                await self._patch(
                    spec,
                    spec.kind.Scale,
                    {"metadata": {"resourceVersion": version}, "spec": {"replicas": replicas}},
                    f"scale to {replicas}",
                )
            except DriverError as exc:
                if not _conflict(exc):
                    raise
                workload = await self._workload(spec)  # changed meanwhile: look again
                continue
            return workload
        raise DriverError(f"{spec.member}: scale {spec.label}: kept conflicting with other writers")

    async def _patch(self, spec: WorkloadSpec, kind: Any, body: dict[str, Any], action: str) -> Any:
        return await self._call(
            spec,
            action,
            self._kube.patch(
                kind, spec.name, body, namespace=spec.namespace, patch_type=PatchType.MERGE
            ),
        )

    async def _pods(self, spec: WorkloadSpec, selector: Selector) -> list[Pod]:
        async def collect() -> list[Pod]:
            return [
                pod async for pod in self._kube.list(Pod, namespace=spec.namespace, labels=selector)
            ]

        pods: list[Pod] = await self._call(spec, "list pods of", collect())
        return pods

    async def _wait_pods_gone(self, spec: WorkloadSpec, selector: Selector) -> None:
        """Return once no pod matches ``selector``: list, then watch until all are deleted.

        The watch starts at the list's resource version, so no deletion between the two
        is missed; a pod created meanwhile (ADDED) is waited for too. If the watch's
        history expired (410 Gone), the list is taken again.
        """
        while True:
            remaining, version = await self._pod_names(spec, selector)
            if not remaining:
                return
            log.info("kubernetes_waiting_for_pods", pool=self._pool, member=spec.member,
                     pods=sorted(remaining))  # fmt: skip
            watch = self._kube.watch(
                Pod,
                namespace=spec.namespace,
                labels=selector,
                resource_version=version,
                server_timeout=WATCH_SERVER_TIMEOUT_S,
            )
            try:
                await self._call(spec, "watch pods of", _until_empty(watch, remaining))
            except DriverError as exc:
                if isinstance(exc.__cause__, ApiError) and exc.__cause__.status.code == 410:
                    continue  # the watch's history expired: list again
                raise
            return

    async def _pod_names(self, spec: WorkloadSpec, selector: Selector) -> tuple[set[str], str]:
        """Names of the pods ``selector`` matches, and the list's resource version."""
        listing = self._kube.list(Pod, namespace=spec.namespace, labels=selector)

        async def collect() -> set[str]:
            return {pod_name(pod) async for pod in listing}

        names: set[str] = await self._call(spec, "list pods of", collect())
        return names, listing.resourceVersion

    def _slots_url(self, spec: WorkloadSpec, pod: Pod) -> str | None:
        """The pod's /slots URL; None for a pod without an IP (it serves nothing)."""
        ip = pod.status.podIP if pod.status is not None else None
        if not ip:
            return None
        port = spec.slots_port or container_port(pod)
        if port is None:
            raise DriverError(
                f"{spec.member}: pod {pod_name(pod)} declares no container port; "
                "set the member's kubernetes.slotsPort"
            )
        host = f"[{ip}]" if ":" in ip else ip
        return f"http://{host}:{port}/slots"


async def _until_empty(watch: Any, remaining: set[str]) -> None:
    """Consume pod events until ``remaining`` is empty; close the stream either way."""
    try:
        async for event, pod in watch:
            if event == "BOOKMARK":
                continue
            if event == "DELETED":
                remaining.discard(pod_name(pod))
            else:
                remaining.add(pod_name(pod))
            if not remaining:
                return
    finally:
        await watch.aclose()


def _conflict(exc: DriverError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ApiError) and cause.status.code == HTTP_CONFLICT
