"""A small Kubernetes API server for the calls the kubernetes driver makes.

It speaks the real REST semantics of those calls, on a real socket:

- ``GET /apis/apps/v1/namespaces/{ns}/{deployments|statefulsets}/{name}``
- ``GET`` and ``PATCH .../{name}/scale`` (``autoscaling/v1`` Scale; a PATCH needs a patch
  content type, 415 otherwise; merge patches are applied as RFC 7386 says)
- ``PATCH .../{name}`` (a merge patch of the workload's ``metadata.annotations``)
- a PATCH whose body names ``metadata.resourceVersion`` is refused with 409 Conflict unless
  that is the object's current version (optimistic concurrency, as the API server does)
- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` (a PodList with its
  ``resourceVersion``)
- ``GET /api/v1/namespaces/{ns}/pods?watch=true&resourceVersion=N&labelSelector=...``:
  one JSON event per line (``ADDED``/``MODIFIED``/``DELETED``) after version N, held open
  until ``timeoutSeconds``; a version older than the kept history gets an ``ERROR`` event
  with a 410 Status, like a compacted etcd
- errors are ``Status`` objects with ``Content-Type: application/json``

and it plays the workload controller: scaling to 1 creates a pod (Pending, then Running
with an IP and ready, which makes the workload available); scaling to 0 marks the pods
terminating at once and deletes them after ``termination_s``. Every request is recorded
(method, path, query, content type, JSON body) and so is a timeline of what happened
(``scale``, ``pod_deleted`` ...), so tests can assert exact calls and their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

APPS = "/apis/apps/v1/namespaces/{ns}/{plural}/{name}"
PATCH_TYPES = frozenset(
    {
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
    }
)
KINDS = {"deployments": "Deployment", "statefulsets": "StatefulSet"}
BODY = web.RequestKey("body", object)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any


@dataclass
class Moment:
    """One thing that happened, in order."""

    at: float
    what: str
    name: str
    detail: Any = None


@dataclass
class Workload:
    plural: str
    namespace: str
    name: str
    replicas: int
    labels: dict[str, str]
    port: int | None
    uid: int
    generation: int = 1
    available: int = 0
    conditions: list[dict[str, str]] = field(default_factory=list)
    resource_version: int = 0
    annotations: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "server", "image": "llama-server"}
        if self.port is not None:
            container["ports"] = [{"name": "http", "containerPort": self.port}]
        return {
            "apiVersion": "apps/v1",
            "kind": KINDS[self.plural],
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": str(self.resource_version),
                "generation": self.generation,
                "annotations": dict(self.annotations),
            },
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": self.labels},
                "template": {
                    "metadata": {"labels": self.labels},
                    "spec": {"containers": [container]},
                },
            },
            "status": {
                "observedGeneration": self.generation,
                "replicas": self.available,
                "availableReplicas": self.available,
                "readyReplicas": self.available,
                "conditions": self.conditions,
            },
        }

    def scale(self) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": str(self.resource_version),
            },
            "spec": {"replicas": self.replicas},
            "status": {
                "replicas": self.available,
                "selector": ",".join(f"{k}={v}" for k, v in self.labels.items()),
            },
        }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """A label selector (``a=b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``)."""
    for raw in re.split(r",(?![^()]*\))", selector):
        term = raw.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, operator, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            inside = key in labels and labels[key] in values
            if inside != (operator == "in"):
                return False
        elif m := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", term):
            key, operator, value = m[1], m[2], m[3]
            if (labels.get(key) == value) != (operator != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def status(code: int, reason: str, message: str) -> web.Response:
    return _json(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        code,
    )


def _json(body: Any, code: int = 200) -> web.Response:
    # The API server answers exactly "application/json", without a charset.
    return web.Response(
        body=json.dumps(body).encode(), status=code, headers={"Content-Type": "application/json"}
    )


class KubeApi:
    """The server; see the module docstring. ``async with KubeApi() as api`` runs it."""

    def __init__(
        self,
        *,
        pending_s: float = 0.05,
        ready_s: float = 0.1,
        termination_s: float = 0.4,
        token: str | None = None,
    ) -> None:
        self.pending_s = pending_s
        self.ready_s = ready_s
        self.termination_s = termination_s
        self.token = token
        self.workloads: dict[tuple[str, str, str], Workload] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.timeline: list[Moment] = []
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.expire_watches = 0
        """This many next watches get 410 Gone, as if etcd compacted their version away."""
        self.down = False
        self._version = itertools.count(100)
        self._uid = itertools.count(1)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application(middlewares=[self._record])
        app.router.add_get(APPS, self._get_workload)
        app.router.add_get(APPS + "/scale", self._get_scale)
        app.router.add_patch(APPS + "/scale", self._patch_scale)
        app.router.add_patch(APPS, self._patch_workload)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert self._runner is not None
        await self._runner.cleanup()

    def kubeconfig(self, token: str | None = None) -> dict[str, Any]:
        """A kubeconfig document pointing at this server."""
        user: dict[str, Any] = {"token": token} if token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [
                {"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "llm"}}
            ],
            "current-context": "test",
        }

    # --- state set-up -----------------------------------------------------------------

    def add_workload(
        self,
        name: str,
        *,
        plural: str = "deployments",
        namespace: str = "llm",
        replicas: int = 0,
        port: int | None = 8080,
        labels: dict[str, str] | None = None,
    ) -> Workload:
        """A workload; with ``replicas: 1`` its pod runs and is available at once."""
        workload = Workload(
            plural, namespace, name, replicas, labels or {"app": name}, port, next(self._uid)
        )
        workload.resource_version = next(self._version)
        self.workloads[(plural, namespace, name)] = workload
        if replicas:
            pod = self._new_pod(workload)
            self._set_running(pod)
            workload.available = 1
        return workload

    def workload(self, name: str, plural: str = "deployments", namespace: str = "llm") -> Workload:
        return self.workloads[(plural, namespace, name)]

    def pods_of(self, workload: Workload) -> list[dict[str, Any]]:
        return [
            p
            for (ns, _), p in self.pods.items()
            if ns == workload.namespace
            and selector_matches(_selector(workload), p["metadata"]["labels"])
        ]

    def calls(self, *, skip_repeats: bool = True) -> list[tuple[str, str, dict[str, str]]]:
        """(method, path, query) of each request; consecutive repeats (polls) collapsed."""
        out: list[tuple[str, str, dict[str, str]]] = []
        for r in self.requests:
            call = (r.method, r.path, r.query)
            if not (skip_repeats and out and out[-1] == call):
                out.append(call)
        return out

    def moments(self, what: str) -> list[Moment]:
        return [m for m in self.timeline if m.what == what]

    # --- handlers ---------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Content-Type"),
                body,
            )
        )
        if self.down:
            return status(503, "ServiceUnavailable", "the API server is unavailable")
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return status(401, "Unauthorized", "Unauthorized")
        request[BODY] = body
        response: web.StreamResponse = await handler(request)
        return response

    def _find(self, request: web.Request) -> Workload | web.Response:
        plural, ns, name = (request.match_info[k] for k in ("plural", "ns", "name"))
        if plural not in KINDS:
            return status(404, "NotFound", "the server could not find the requested resource")
        workload = self.workloads.get((plural, ns, name))
        if workload is None:
            return status(404, "NotFound", f'{plural}.apps "{name}" not found')
        return workload

    async def _get_workload(self, request: web.Request) -> web.Response:
        found = self._find(request)
        return found if isinstance(found, web.Response) else _json(found.body())

    async def _get_scale(self, request: web.Request) -> web.Response:
        found = self._find(request)
        return found if isinstance(found, web.Response) else _json(found.scale())

    def _patchable(self, request: web.Request) -> Workload | web.Response:
        """The workload a merge patch may apply to, or the refusal (type, version)."""
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type not in PATCH_TYPES:
            return status(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(sorted(PATCH_TYPES))}",
            )
        if content_type != "application/merge-patch+json":
            return status(400, "BadRequest", "this server only applies merge patches")
        body = request[BODY]
        wanted = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        if wanted is not None and str(wanted) != str(found.resource_version):
            return status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {found.plural}.apps "{found.name}": the '
                "object has been modified; please apply your changes to the latest version",
            )
        return found

    async def _patch_workload(self, request: web.Request) -> web.Response:
        found = self._patchable(request)
        if isinstance(found, web.Response):
            return found
        annotations = merge_patch(found.annotations, request[BODY].get("metadata", {}).get(
            "annotations", {}))  # fmt: skip
        if annotations != found.annotations:
            found.annotations = {k: v for k, v in annotations.items() if v is not None}
            found.resource_version = next(self._version)
            self.timeline.append(Moment(time.monotonic(), "annotate", found.name, annotations))
        return _json(found.body())

    async def _patch_scale(self, request: web.Request) -> web.Response:
        found = self._patchable(request)
        if isinstance(found, web.Response):
            return found
        patched = merge_patch(found.scale(), request[BODY])
        replicas = patched.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return status(422, "Invalid", "spec.replicas: Invalid value")
        self.timeline.append(Moment(time.monotonic(), "scale", found.name, replicas))
        if replicas != found.replicas:
            found.replicas = replicas
            found.generation += 1  # a spec change; this controller observes it at once
            found.conditions = [
                {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
            ]
            found.resource_version = next(self._version)
            self._spawn(self._reconcile(found))
        return _json(found.scale())

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") in {"true", "1"}:
            return await self._watch(request, ns, selector)
        items = [
            p
            for (pod_ns, _), p in sorted(self.pods.items())
            if pod_ns == ns and selector_matches(selector, p["metadata"]["labels"])
        ]
        return _json(
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self._current_version())},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, ns: str, selector: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        since_text = request.query.get("resourceVersion")

        def wanted(pod: dict[str, Any]) -> bool:
            return pod["metadata"]["namespace"] == ns and selector_matches(
                selector, pod["metadata"]["labels"]
            )

        async def send(event: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

        if since_text is None:
            since = self._current_version()
            for pod in list(self.pods.values()):
                if wanted(pod):
                    await send("ADDED", pod)
        else:
            since = int(since_text)
            if self.expire_watches > 0:
                self.expire_watches -= 1
                await send(
                    "ERROR",
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": f"too old resource version: {since}",
                        "reason": "Expired",
                        "code": 410,
                    },
                )
                return response
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            async with asyncio.timeout(timeout):
                while True:
                    async with self._changed:
                        events = [e for e in self.history if e[0] > since]
                        if not events:
                            await self._changed.wait()
                            continue
                    for version, event, pod in events:
                        since = version
                        if wanted(pod):
                            await send(event, pod)
        return response

    # --- the workload controller ------------------------------------------------------

    def _current_version(self) -> int:
        return max([99, *(e[0] for e in self.history)])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile(self, workload: Workload) -> None:
        if workload.replicas == 0:
            workload.available = 0
            for pod in self.pods_of(workload):
                if "deletionTimestamp" not in pod["metadata"]:
                    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                    await self._emit("MODIFIED", pod)
            terminating = self.pods_of(workload)
            await asyncio.sleep(self.termination_s)  # a pod's scripted termination time
            for pod in terminating:
                del self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])]
                self.timeline.append(
                    Moment(time.monotonic(), "pod_deleted", workload.name, pod["metadata"]["name"])
                )
                await self._emit("DELETED", pod)
            return
        if any("deletionTimestamp" not in p["metadata"] for p in self.pods_of(workload)):
            return
        await asyncio.sleep(self.pending_s)  # scripted: a pod pending, then created
        pod = self._new_pod(workload)
        await self._emit("ADDED", pod)
        await asyncio.sleep(self.ready_s)  # scripted: a container starting
        if workload.replicas == 0 or "deletionTimestamp" in pod["metadata"]:
            return
        self._set_running(pod)
        await self._emit("MODIFIED", pod)
        workload.available = 1
        workload.resource_version = next(self._version)
        self.timeline.append(Moment(time.monotonic(), "available", workload.name))

    def _new_pod(self, workload: Workload) -> dict[str, Any]:
        name = f"{workload.name}-{next(self._uid):05d}"
        container: dict[str, Any] = {"name": "server", "image": "llama-server"}
        if workload.port is not None:
            container["ports"] = [{"name": "http", "containerPort": workload.port}]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": workload.namespace,
                "labels": dict(workload.labels),
                "resourceVersion": str(next(self._version)),
            },
            "spec": {"containers": [container]},
            "status": {"phase": "Pending"},
        }
        self.pods[(workload.namespace, name)] = pod
        self.timeline.append(Moment(time.monotonic(), "pod_created", workload.name, name))
        return pod

    def _set_running(self, pod: dict[str, Any]) -> None:
        pod["status"] = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        }

    async def _emit(self, event: str, pod: dict[str, Any]) -> None:
        version = next(self._version)
        pod["metadata"]["resourceVersion"] = str(version)
        async with self._changed:
            self.history.append((version, event, json.loads(json.dumps(pod))))
            self._changed.notify_all()


def _selector(workload: Workload) -> str:
    return ",".join(f"{k}={v}" for k, v in workload.labels.items())


@contextlib.asynccontextmanager
async def slots_server(busy: dict[str, bool]) -> AsyncIterator[int]:
    """A llama.cpp-style ``/slots`` on 127.0.0.1 (the pods' IP); ``busy['busy']`` sets it.
    ``busy['broken']`` makes it answer 500."""

    async def slots(_request: web.Request) -> web.Response:
        if busy.get("broken"):
            return web.Response(status=500, text="boom")
        return web.json_response(
            [{"id": 0, "is_processing": busy.get("busy", False)}, {"id": 1, "is_processing": False}]
        )

    app = web.Application()
    app.router.add_get("/slots", slots)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
