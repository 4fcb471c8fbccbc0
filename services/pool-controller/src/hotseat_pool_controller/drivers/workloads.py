"""What the ``kubernetes`` driver reads from a workload and its pods: the member's
workload as configured, its replica counts and availability, a rollout that is stuck, its
pod selector as label filters, and a pod's name and serving port."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import operators as op
from lightkube.models.meta_v1 import LabelSelector
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.core_v1 import Pod

from hotseat_pool_controller.drivers.base import DriverError

Workload = Deployment | StatefulSet
Selector = dict[str, str | op.Operator[Any] | Iterable[Any] | None]


@dataclass(frozen=True)
class WorkloadSpec:
    """One member's workload, from the config."""

    member: str
    kind: type[Deployment | StatefulSet]
    name: str
    namespace: str
    slots_port: int | None

    @property
    def label(self) -> str:
        return f"{self.kind.__name__.lower()} {self.namespace}/{self.name}"


def pod_name(pod: Pod) -> str:
    return pod.metadata.name if pod.metadata is not None and pod.metadata.name else "?"


def replica_count(workload: Workload) -> int:
    replicas = workload.spec.replicas if workload.spec is not None else None
    return 1 if replicas is None else replicas  # the API defaults an unset count to 1


def available(workload: Workload) -> bool:
    available = workload.status.availableReplicas if workload.status is not None else None
    return (available or 0) >= 1


def raise_if_failed(spec: WorkloadSpec, workload: Workload) -> None:
    """A Deployment that reports its rollout stuck will not become available. Only a
    status the Deployment controller wrote after seeing the current spec counts (an old
    failure from before this scale-up says nothing about it)."""
    if not isinstance(workload, Deployment) or workload.status is None:
        return
    generation = workload.metadata.generation if workload.metadata is not None else None
    observed = workload.status.observedGeneration
    if generation is None or observed is None or observed < generation:
        return
    for condition in workload.status.conditions or ():
        stuck = (
            condition.type == "Progressing"
            and condition.status == "False"
            and condition.reason == "ProgressDeadlineExceeded"
        )
        failure = condition.type == "ReplicaFailure" and condition.status == "True"
        if stuck or failure:
            raise DriverError(
                f"{spec.member}: {spec.label} cannot become available: "
                f"{condition.reason}: {condition.message}"
            )


def selector_of(spec: WorkloadSpec, workload: Workload) -> Selector:
    """The workload's pod selector as lightkube label filters."""
    selector: LabelSelector | None = workload.spec.selector if workload.spec is not None else None
    if selector is None:
        raise DriverError(f"{spec.member}: {spec.label} has no pod selector")
    labels: Selector = dict(_match_labels(selector.matchLabels))
    for requirement in selector.matchExpressions or ():
        values = requirement.values or []
        operators: dict[str, op.Operator[Any]] = {
            "In": op.in_(values),
            "NotIn": op.not_in(values),
            "Exists": op.exists(),
            "DoesNotExist": op.not_exists(),
        }
        if requirement.operator not in operators or requirement.key in labels:
            raise DriverError(
                f"{spec.member}: {spec.label} selector {requirement.key} "
                f"{requirement.operator} cannot be expressed as a label filter"
            )
        labels[requirement.key] = operators[requirement.operator]
    if not labels:
        raise DriverError(f"{spec.member}: {spec.label} has an empty pod selector")
    return labels


def _match_labels(labels: Mapping[str, str] | None) -> Mapping[str, str]:
    return labels or {}


def container_port(pod: Pod) -> int | None:
    """The container port named ``http``, else the first declared one."""
    ports = [
        port
        for container in (pod.spec.containers if pod.spec is not None else [])
        for port in container.ports or ()
    ]
    named = next((p for p in ports if p.name == "http"), None)
    chosen = named or (ports[0] if ports else None)
    return chosen.containerPort if chosen is not None else None
