"""Render a kustomization the way ``kustomize build`` does, for the subset Hotseat uses.

Used by ``make deploy-check`` to validate the manifests offline, where no kustomize
binary exists. Supported, with kustomize's meaning:

- ``resources``: YAML files (several documents each) and directories holding a
  ``kustomization.yaml``, rendered recursively, in order;
- ``namespace``: set on every namespaced object (and on RoleBinding subjects that are
  ServiceAccounts without one), never on cluster-scoped kinds;
- ``labels`` with ``pairs`` and ``includeSelectors: false`` (metadata labels only);
- ``images``: ``newName`` / ``newTag`` for containers whose image name matches;
- ``configMapGenerator`` with ``files`` (``key=path`` or ``path``), ``literals``,
  ``behavior: create`` and ``options.labels``; ``options.disableNameSuffixHash: true``
  is required (name hashing and reference rewriting are not implemented);
- ``patches`` with a ``path`` to a strategic merge patch (target from its kind and
  name; lists of objects merged by ``name``, as Kubernetes does for containers, env,
  ports, volumes and volume mounts).

Any other field is an error rather than silently ignored, so a manifest never renders
differently here than in a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CLUSTER_SCOPED", "KustomizeError", "render"]

Obj = dict[str, Any]

SUPPORTED = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "labels",
        "images",
        "configMapGenerator",
        "patches",
    }
)
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
    }
)
_MERGE_KEY = "name"


class KustomizeError(Exception):
    """The kustomization uses something this renderer does not support, or is broken."""


def render(directory: Path) -> list[Obj]:
    """The objects ``kustomize build directory`` would print, in the same order."""
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = sorted(set(spec) - SUPPORTED)
    if unknown:
        raise KustomizeError(f"{path}: unsupported fields {unknown}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects.extend(render(target))
        elif target.is_file():
            objects.extend(_load(target))
        else:
            raise KustomizeError(f"{path}: resource {entry!r} does not exist")
    objects.extend(_generate(directory, spec.get("configMapGenerator", []), path))
    for patch in spec.get("patches", []):
        _patch(objects, directory, patch, path)
    for label in spec.get("labels", []):
        _label(objects, label, path)
    if "namespace" in spec:
        _namespace(objects, spec["namespace"])
    for image in spec.get("images", []):
        _image(objects, image)
    _check_unique(objects, path)
    return objects


def _load(path: Path) -> list[Obj]:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document:
            raise KustomizeError(f"{path}: a document is not a Kubernetes object")
    return documents


def _generate(directory: Path, generators: Iterable[Obj], source: Path) -> list[Obj]:
    out: list[Obj] = []
    for generator in generators:
        options = generator.get("options", {})
        if options.get("disableNameSuffixHash") is not True:
            raise KustomizeError(
                f"{source}: configMapGenerator {generator.get('name')}: set "
                "options.disableNameSuffixHash: true (hashed names are not rendered here)"
            )
        if generator.get("behavior", "create") != "create":
            raise KustomizeError(f"{source}: only behavior: create is supported")
        data: dict[str, str] = {}
        for item in generator.get("files", []):
            key, _, name = item.rpartition("=") if "=" in item else ("", "", item)
            file = directory / name
            if not file.is_file():
                raise KustomizeError(f"{source}: configMapGenerator file {name!r} does not exist")
            data[key or Path(name).name] = file.read_text(encoding="utf-8")
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        metadata: Obj = {"name": generator["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return out


def _patch(objects: list[Obj], directory: Path, patch: Obj, source: Path) -> None:
    if set(patch) != {"path"}:
        raise KustomizeError(f"{source}: only patches with a path are supported")
    for document in _load(directory / patch["path"]):
        name = document.get("metadata", {}).get("name")
        matches = [
            o
            for o in objects
            if o["kind"] == document["kind"] and o.get("metadata", {}).get("name") == name
        ]
        if len(matches) != 1:
            raise KustomizeError(
                f"{source}: patch {patch['path']} targets {document['kind']}/{name}, "
                f"which matches {len(matches)} objects"
            )
        merged = strategic_merge(matches[0], document)
        matches[0].clear()
        matches[0].update(merged)


def strategic_merge(base: Any, patch: Any) -> Any:
    """A strategic merge patch: maps merge, lists of named objects merge by name, other
    lists and scalars are replaced, ``null`` deletes."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if _named_list(base) and _named_list(patch):
        out_list = copy.deepcopy(base)
        for item in patch:
            index = next(
                (i for i, b in enumerate(out_list) if b[_MERGE_KEY] == item[_MERGE_KEY]), None
            )
            if index is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[index] = strategic_merge(out_list[index], item)
        return out_list
    return copy.deepcopy(patch)


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and _MERGE_KEY in v for v in value)


def _label(objects: list[Obj], label: Obj, source: Path) -> None:
    if label.get("includeSelectors", False) or label.get("includeTemplates", False):
        raise KustomizeError(f"{source}: only labels with includeSelectors: false are supported")
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("labels", {}).update(label.get("pairs", {}))


def _namespace(objects: list[Obj], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        obj.setdefault("metadata", {})["namespace"] = namespace
        if obj["kind"] in {"RoleBinding", "ClusterRoleBinding"}:
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject.setdefault("namespace", namespace)


def _image(objects: list[Obj], image: Obj) -> None:
    for container in _containers(objects):
        name, tag = _split_image(container.get("image", ""))
        if name != image["name"]:
            continue
        new_name = image.get("newName", name)
        new_tag = image.get("newTag", tag)
        container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name


def _split_image(image: str) -> tuple[str, str | None]:
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = image.rpartition(":")
        return name, tag
    return image, None


def _containers(objects: Iterable[Obj]) -> Iterable[Obj]:
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None:
            yield from spec.get("initContainers", [])
            yield from spec.get("containers", [])


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec of a workload (Deployment, StatefulSet, DaemonSet, Job) or Pod."""
    if obj.get("kind") == "Pod":
        spec: Obj | None = obj.get("spec")
        return spec
    template = obj.get("spec", {}).get("template")
    return template.get("spec") if isinstance(template, dict) else None


def _check_unique(objects: list[Obj], source: Path) -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for obj in objects:
        metadata = obj.get("metadata", {})
        key = (obj["kind"], metadata.get("name", ""), metadata.get("namespace"))
        if key in seen:
            raise KustomizeError(f"{source}: {key[0]}/{key[1]} is defined twice")
        seen.add(key)
