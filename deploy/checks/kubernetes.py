"""Kubernetes manifests: render an overlay, validate every object, check references.

Each rendered object is validated against the Kubernetes OpenAPI schemas of
:data:`KUBERNETES_VERSION` (strict: an unknown field fails), PodMonitors against the
fields of their CRD that Hotseat uses. Then what no schema sees: ConfigMaps, Secrets,
PVCs and ServiceAccounts that pods use (unless optional), workload selectors against
their templates, Service selectors and named target ports, HPA, PDB and RoleBinding
targets, pinned images, and the Hotseat config in ConfigMap ``hotseat-config``: valid,
its backends are Services with that port, and each kubernetes pool member is a workload
shipped at 0 replicas that a Role lets the driver read, scale and watch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from deploy.checks.hotseat import load_hotseat_config
from deploy.checks.report import Report
from deploy.checks.schema import schema_errors
from deploy.kustomize import CLUSTER_SCOPED, KustomizeError, pod_spec, render
from hotseat_common.config import HotseatConfig

KUBERNETES_VERSION = "1.30"
"""Oldest Kubernetes release the manifests must validate against."""
DRIVER_VERBS = {"": frozenset({"get"}), "scale": frozenset({"get", "patch"})}
"""The kubernetes driver's verbs on a member's workload ("") and on its scale subresource."""
POD_VERBS = frozenset({"list", "watch"})
"""The kubernetes driver's verbs on pods."""

Obj = dict[str, Any]
Key = tuple[str, str | None, str]

POD_MONITOR_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object"},
                        "matchExpressions": {"type": "array"},
                    },
                },
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                        },
                    },
                },
            },
        },
    },
}
"""The PodMonitor fields Hotseat uses (kubernetes-validate ships no CRD schemas)."""


def check_overlay(report: Report, root: Path, overlay: Path) -> list[Obj]:
    """Render ``overlay`` and check every object; the objects, for further tests."""
    where = str(overlay.relative_to(root))
    try:
        objects = render(overlay)
    except (KustomizeError, yaml.YAMLError) as exc:
        report.fail(where, f"render: {exc}")
        return []
    for obj in objects:
        validate(report, f"{where}: {_name(obj)}", obj)
    check_references(report, where, objects)
    report.ok(f"kubernetes {where}: {len(objects)} objects")
    return objects


def validate(report: Report, where: str, obj: Obj) -> None:
    if obj["kind"] == "PodMonitor":
        for error in schema_errors(obj, POD_MONITOR_SCHEMA):
            report.fail(where, error)
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        report.fail(where, f"{'.'.join(str(p) for p in exc.path)}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError as exc:
        report.fail(where, exc.message)


def _name(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj.get('metadata', {}).get('name')}"


def _key(obj: Mapping[str, Any]) -> Key:
    return (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pod_labels(workload: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    return labels


def check_references(report: Report, where: str, objects: list[Obj]) -> None:
    index = {_key(o): o for o in objects}
    workloads = [o for o in objects if pod_spec(o) is not None]
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED and not obj["metadata"].get("namespace"):
            report.fail(where, f"{_name(obj)} has no namespace")
        if pod_spec(obj) is not None:
            _check_workload(report, where, obj, index)
        if obj["kind"] == "Service":
            _check_service(report, where, obj, workloads)
        elif obj["kind"] in {"PodDisruptionBudget", "PodMonitor"}:
            selector = obj["spec"]["selector"].get("matchLabels", {})
            if not any(_matches(selector, _pod_labels(w)) for w in workloads):
                report.fail(where, f"{_name(obj)} selects no pods")
        else:
            _check_refs(report, where, obj, index)
    config = _hotseat_config(report, where, objects)
    if config is not None:
        _check_members(report, where, config, objects, index)
        _check_backends(report, where, config, objects)


def _check_refs(report: Report, where: str, obj: Obj, index: Mapping[Key, Obj]) -> None:
    """HPA targets, RoleBinding roles and subjects."""
    ns = obj["metadata"].get("namespace")
    refs: list[tuple[str, str | None, str]] = []
    if obj["kind"] == "HorizontalPodAutoscaler":
        target = obj["spec"]["scaleTargetRef"]
        refs.append((target["kind"], ns, target["name"]))
    if obj["kind"] == "RoleBinding":
        refs.append((obj["roleRef"]["kind"], ns, obj["roleRef"]["name"]))
        refs.extend((s["kind"], s.get("namespace"), s["name"]) for s in obj.get("subjects", []))
    for ref in refs:
        if ref not in index:
            report.fail(where, f"{_name(obj)} refers to missing {ref[0]}/{ref[2]}")


def _check_workload(report: Report, where: str, workload: Obj, index: Mapping[Key, Obj]) -> None:
    name = _name(workload)
    ns = workload["metadata"].get("namespace")
    spec = pod_spec(workload) or {}
    selector = workload["spec"].get("selector", {}).get("matchLabels", {})
    if not _matches(selector, _pod_labels(workload)):
        report.fail(where, f"{name}: selector does not match its pod template")
    account = spec.get("serviceAccountName")
    if account and ("ServiceAccount", ns, account) not in index:
        report.fail(where, f"{name}: ServiceAccount {account} is missing")
    for kind, ref in _pod_references(spec):
        if (kind, ns, ref) not in index:
            report.fail(where, f"{name}: {kind} {ref} is missing")
    declared = {v["name"] for v in spec.get("volumes", [])} | {
        t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
    }
    for container in spec.get("containers", []):
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in declared:
                report.fail(where, f"{name}: mounts undeclared volume {mount['name']}")
        image = container.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            report.fail(where, f"{name}: image {image!r} is not pinned to a tag")


def _pod_references(spec: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(kind, name) of each ConfigMap, Secret and PVC a pod needs (optional ones left out)."""
    for volume in spec.get("volumes", []):
        if "configMap" in volume and not volume["configMap"].get("optional"):
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume and not volume["secret"].get("optional"):
            yield "Secret", volume["secret"]["secretName"]
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
    for container in spec.get("containers", []):
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if key in source and not source[key].get("optional"):
                    yield kind, source[key]["name"]


def _check_service(report: Report, where: str, service: Obj, workloads: list[Obj]) -> None:
    selector = service["spec"].get("selector", {})
    ns = service["metadata"].get("namespace")
    selected = [
        w
        for w in workloads
        if w["metadata"].get("namespace") == ns and _matches(selector, _pod_labels(w))
    ]
    if not selected:
        report.fail(where, f"{_name(service)} selects no pods")
        return
    names = {
        port.get("name")
        for w in selected
        for container in (pod_spec(w) or {}).get("containers", [])
        for port in container.get("ports", [])
    }
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        if isinstance(target, str) and target not in names:
            report.fail(where, f"{_name(service)}: targetPort {target} names no container port")


def _hotseat_config(report: Report, where: str, objects: list[Obj]) -> HotseatConfig | None:
    found = [o for o in objects if _name(o) == "ConfigMap/hotseat-config"]
    text = found[0].get("data", {}).get("hotseat.yaml") if len(found) == 1 else None
    if text is None:
        report.fail(where, "no ConfigMap hotseat-config with a key hotseat.yaml")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hotseat.yaml"
        path.write_text(text, encoding="utf-8")
        return load_hotseat_config(report, f"{where}: ConfigMap/hotseat-config", path)


def _check_members(
    report: Report, where: str, config: HotseatConfig, objects: list[Obj], index: Mapping[Key, Obj]
) -> None:
    roles = [o for o in objects if o["kind"] == "Role"]
    for pool in config.pools:
        if pool.driver.kind != "kubernetes":
            continue
        for member in pool.members:
            workload = member.kubernetes
            if workload is None:
                continue
            ns = workload.namespace or pool.driver.namespace
            label = f"pool {pool.name} member {member.name}"
            found = index.get((workload.workload, ns, workload.name))
            if found is None:
                report.fail(where, f"{label}: no {workload.workload} {ns}/{workload.name}")
                continue
            if found["spec"].get("replicas", 1) != 0:
                report.fail(where, f"{label}: {workload.name} does not ship at 0 replicas")
            plural = workload.workload.lower() + "s"
            for sub, verbs in DRIVER_VERBS.items():
                resource = f"{plural}/{sub}" if sub else plural
                if not granted(
                    roles, ns, "apps", resource=resource, name=workload.name, verbs=verbs
                ):
                    report.fail(where, f"{label}: no Role grants {sorted(verbs)} on {resource}")
            if not granted(roles, ns, "", resource="pods", name=None, verbs=POD_VERBS):
                report.fail(where, f"{label}: no Role grants {sorted(POD_VERBS)} on pods")


def _check_backends(report: Report, where: str, config: HotseatConfig, objects: list[Obj]) -> None:
    services = [o for o in objects if o["kind"] == "Service"]
    for backend in config.backends:
        parts = urlsplit(backend.address)
        name, _, namespace = (parts.hostname or "").partition(".")
        matches = [
            s
            for s in services
            if s["metadata"]["name"] == name
            and (not namespace or s["metadata"].get("namespace") == namespace.split(".")[0])
        ]
        if not matches:
            report.fail(where, f"backend {backend.name}: no Service {parts.hostname}")
        elif parts.port not in {p["port"] for p in matches[0]["spec"]["ports"]}:
            report.fail(where, f"backend {backend.name}: Service {name} has no port {parts.port}")


def granted(
    roles: Iterable[Mapping[str, Any]],
    namespace: str,
    group: str,
    *,
    resource: str,
    name: str | None,
    verbs: Iterable[str],
) -> bool:
    """True when the Roles of ``namespace`` together grant ``verbs`` on ``resource``
    (named ``name``, or any name when ``None``)."""
    missing = set(verbs)
    for role in roles:
        if role["metadata"].get("namespace") != namespace:
            continue
        for rule in role.get("rules", []):
            if group not in rule.get("apiGroups", []) or resource not in rule.get("resources", []):
                continue
            names = rule.get("resourceNames")
            if names and (name is None or name not in names):
                continue
            missing -= set(rule.get("verbs", []))
    return not missing
