"""Compose files: the Compose Specification schema, then what the schema cannot see.

A project is ``compose.yaml`` alone or with overrides (``-f compose.yaml -f
compose.gpu.yaml``), merged the way Compose merges them. Cross-references checked on the
merged project: images or builds (contexts, Dockerfiles and targets exist),
``depends_on`` targets and conditions (``service_healthy`` needs a health check; no
dependency on a service that its profiles leave out), bind-mount sources, named volumes,
commands that are Hotseat entry points, and the Hotseat config each Hotseat service
mounts (valid, every sim serves a backend of it on that backend's port, every backend
address is a service of the project). nginx's upstreams must be router services.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from deploy.checks import dockerfile
from deploy.checks.hotseat import entry_points, load_hotseat_config
from deploy.checks.report import Report
from deploy.checks.schema import schema_errors

HOTSEAT_CONFIG_PATH = "/etc/hotseat/hotseat.yaml"
CONDITIONS = frozenset({"service_started", "service_healthy", "service_completed_successfully"})


# --- YAML with Compose's merge tags ------------------------------------------------------


class _Reset:
    """``!reset``: the key is removed from what is being overridden."""


@dataclass(frozen=True)
class _Override:
    """``!override value``: the value replaces, rather than merges with, the base."""

    value: Any


class ComposeLoader(yaml.SafeLoader):
    """Safe YAML plus Compose's ``!reset`` and ``!override`` tags."""


def _reset(_loader: yaml.SafeLoader, _node: yaml.Node) -> _Reset:
    return _Reset()


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> _Override:
    if isinstance(node, yaml.MappingNode):
        return _Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return _Override(loader.construct_sequence(node, deep=True))
    return _Override(loader.construct_scalar(node))  # type: ignore[arg-type]


ComposeLoader.add_constructor("!reset", _reset)
ComposeLoader.add_constructor("!override", _override)


def load(path: Path) -> dict[str, Any]:
    """One compose file, with its merge tags kept for :func:`merge`."""
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=ComposeLoader)  # noqa: S506 - a SafeLoader
    if not isinstance(data, dict):
        raise TypeError(f"{path}: not a mapping")
    return data


def plain(value: Any) -> Any:
    """The document as the schema sees it: tags resolved to their values."""
    if isinstance(value, _Override):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not isinstance(v, _Reset)}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return None if isinstance(value, _Reset) else value


MERGED_LISTS = frozenset({"volumes", "ports", "devices", "secrets", "configs", "expose"})
"""Lists that an override adds to (by target); any other list (``command``, a health
check's ``test``, ...) it replaces."""


def merge(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of an override file: mappings merge, mount and port lists merge by
    their target, other lists are replaced, ``!override`` replaces, ``!reset`` removes."""
    if isinstance(override, _Override):
        return plain(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for name, value in override.items():
            if isinstance(value, _Reset):
                out.pop(name, None)
            else:
                out[name] = merge(out[name], value, name) if name in out else plain(value)
        return out
    if isinstance(base, list) and isinstance(override, list) and key in MERGED_LISTS:
        merged = {_target(v): v for v in base}
        merged.update({_target(v): plain(v) for v in override})
        return list(merged.values())
    return plain(override)


def _target(value: Any) -> Any:
    if isinstance(value, str) and ":" in value:
        return value.split(":")[1]
    if isinstance(value, dict) and "target" in value:
        return value["target"]
    return json.dumps(value, sort_keys=True)


def compose_schema() -> dict[str, Any]:
    """The Compose Specification JSON schema (as vendored by check-jsonschema)."""
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text("utf-8"))
    return schema


# --- the checks -------------------------------------------------------------------------


def check_project(report: Report, root: Path, files: Sequence[str]) -> None:
    """Schema-check each file, merge them, and check the project's cross-references."""
    where = " + ".join(files)
    documents = [load(root / name) for name in files]
    schema = compose_schema()
    for name, document in zip(files, documents, strict=True):
        for error in schema_errors(plain(document), schema):
            report.fail(name, f"compose schema: {error}")
    project: Any = plain(documents[0])
    for override in documents[1:]:
        project = merge(project, override)
    services: dict[str, Any] = project.get("services", {})
    volumes = set(project.get("volumes") or {})
    scripts = entry_points(root)
    for name, service in services.items():
        here = f"{where}: services.{name}"
        _check_image(report, root, here, service)
        _check_depends_on(report, here, service, services)
        for mount in service.get("volumes", []):
            _check_mount(report, root, here, mount, volumes)
        command = service.get("command")
        if isinstance(command, list) and "build" in service and command[0] not in scripts:
            report.fail(here, f"command {command[0]!r} is not a Hotseat entry point")
        if _active(service):
            _check_hotseat_service(report, root, here, service, services)
    report.ok(f"compose {where}: {len(services)} services")


def _active(service: Mapping[str, Any]) -> bool:
    """Started by a plain ``docker compose up`` (no profile asked for)."""
    return not service.get("profiles")


def _check_depends_on(
    report: Report, here: str, service: Mapping[str, Any], services: Mapping[str, Any]
) -> None:
    value = service.get("depends_on") or {}
    specs = {n: {} for n in value} if isinstance(value, list) else value
    for dependency, spec in specs.items():
        if dependency not in services:
            report.fail(here, f"depends_on unknown service {dependency!r}")
            continue
        condition = (spec or {}).get("condition", "service_started")
        if condition not in CONDITIONS:
            report.fail(here, f"depends_on {dependency}: unknown condition {condition!r}")
        if condition == "service_healthy" and "healthcheck" not in services[dependency]:
            report.fail(here, f"waits for {dependency} to be healthy; it has no healthcheck")
        if _active(service) and not _active(services[dependency]):
            report.fail(here, f"depends on {dependency}, which its profiles leave out")


def _check_image(report: Report, root: Path, here: str, service: Mapping[str, Any]) -> None:
    build = service.get("build")
    if build is None:
        image = service.get("image") or ""
        if not image:
            report.fail(here, "has neither image nor build")
        elif ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            report.fail(here, f"image {image!r} is not pinned to a tag")
        return
    build = {"context": build} if isinstance(build, str) else build
    path = root / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
    if not path.is_file():
        report.fail(here, f"build: {path.relative_to(root)} does not exist")
        return
    target = build.get("target")
    if target and target not in dockerfile.stages(path):
        report.fail(here, f"build target {target!r} is not a stage of {path.name}")


def _check_mount(report: Report, root: Path, here: str, mount: Any, volumes: set[str]) -> None:
    source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source", "")
    if source.startswith("$"):
        return  # chosen by the user at run time
    if source.startswith(("./", "../", "/")):
        if not (root / source).exists():
            report.fail(here, f"bind mount source {source} does not exist")
    elif source and source not in volumes:
        report.fail(here, f"volume {source!r} is not declared under volumes")


def _mounted_config(root: Path, service: Mapping[str, Any]) -> Path | None:
    for mount in service.get("volumes", []):
        if isinstance(mount, str) and mount.split(":")[1:2] == [HOTSEAT_CONFIG_PATH]:
            return root / mount.split(":")[0]
    return None


def _check_hotseat_service(
    report: Report, root: Path, here: str, service: Mapping[str, Any], services: Mapping[str, Any]
) -> None:
    command = service.get("command")
    if not isinstance(command, list) or not command[0].startswith("hotseat"):
        return
    path = _mounted_config(root, service)
    if path is None:
        report.fail(here, f"mounts no Hotseat config at {HOTSEAT_CONFIG_PATH}")
        return
    config = load_hotseat_config(report, here, path)
    if config is None:
        return
    for backend in config.backends:
        host = urlsplit(backend.address).hostname
        if host not in services:
            report.fail(here, f"backend {backend.name}: {host} is not a service of the project")
    if command[0] != "hotseat-sim":
        return
    args = dict(zip(command[1::2], command[2::2], strict=False))
    served = config.backend(args.get("--backend", ""))
    if served is None:
        report.fail(here, f"serves backend {args.get('--backend')!r}, not in {path.name}")
    elif str(urlsplit(served.address).port) != args.get("--port"):
        report.fail(here, f"listens on {args.get('--port')}; its backend is {served.address}")


def check_nginx(report: Report, root: Path) -> None:
    """Every nginx upstream is a compose service listening on that port."""
    where = "deploy/compose/nginx.conf"
    services = plain(load(root / "compose.yaml")).get("services", {})
    text = (root / where).read_text(encoding="utf-8")
    upstreams = re.findall(r"^\s*server\s+([^:\s;]+):(\d+)", text, re.MULTILINE)
    if not upstreams:
        report.fail(where, "no upstream servers")
    for host, port in upstreams:
        service = services.get(host)
        if service is None:
            report.fail(where, f"upstream {host} is not a compose service")
        elif service.get("environment", {}).get("HOTSEAT_PORT") != port:
            report.fail(where, f"upstream {host}:{port}: the service listens elsewhere")
    report.ok(f"nginx: {len(upstreams)} upstreams")
