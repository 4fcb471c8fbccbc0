"""The configuration schema: one YAML file shared by every Hotseat component.

Field names follow the LLMKube ModelRouter/ModelPool resources (camelCase on the
wire, snake_case in Python). Durations are seconds parsed from strings like ``300s``.
Cross-references between sections are checked in :mod:`hotseat_common.config.checks`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from hotseat_common.durations import Duration
from hotseat_common.sizes import ByteSize

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]

PositiveDuration = Annotated[Duration, Field(gt=0)]
"""A duration that must be longer than zero (a zero deadline could never be met)."""


_HOST_PORT = re.compile(r"^(?!https?\b)[A-Za-z0-9.-]+(:\d+)?(/.*)?$")
"""``localhost:8080/v1``: an address written without its scheme."""


def http_url(value: str) -> str:
    """Check that ``value`` is an absolute http:// or https:// URL with a host."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"}:
        hint = f" (did you mean 'http://{value}'?)" if _HOST_PORT.match(value) else ""
        raise ValueError(f"{value!r} is not an http:// or https:// URL{hint}")
    if not parts.hostname:
        raise ValueError(f"{value!r} has no host (e.g. http://127.0.0.1:8080)")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ValueError(f"{value!r} has an invalid port") from None
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]
"""An absolute http:// or https:// URL."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


class PoolActivation(StrEnum):
    """What a rule does when a pool member is not resident and its incumbent is busy."""

    WAIT = "Wait"
    IF_IDLE = "IfIdle"


class Tier(StrEnum):
    LOCAL = "local"
    CLOUD = "cloud"


class SwapPolicy(StrEnum):
    STICKY = "sticky"


class BusySignal(StrEnum):
    LEASES = "leases"
    LEASES_AND_SLOTS = "leasesAndSlots"


class DefaultRouteStrategy(StrEnum):
    STATIC = "Static"
    BACKEND_NAME_MATCH = "BackendNameMatch"


class UnknownModels(StrEnum):
    """What the router does with a request for a model that no rule names."""

    REFUSE = "Refuse"
    DEFAULT_ROUTE = "DefaultRoute"


class ClassificationPolicy(_Model):
    header_key: str = "x-hotseat-classification"
    """Request header that carries the request's data classification label."""
    sensitive: tuple[str, ...] = ("pii", "phi")
    """Classification labels that mark a request as sensitive."""


class ApiKeys(_Model):
    """Where client API keys come from: an env var and/or a file, one key per line."""

    env: str | None = None
    """Environment variable that holds the accepted client API keys."""
    file: str | None = None
    """File that holds the accepted client API keys, one per line."""


class RouterPolicy(_Model):
    name: Name = "default"
    """This router's name: the ``router`` label of its metrics and audit events."""
    classification: ClassificationPolicy = ClassificationPolicy()
    """How a request declares its data classification."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0, strict=True)
    """Largest request body accepted; a larger one gets 413 (counted as it streams in)."""
    stream_idle_timeout: PositiveDuration = 300.0
    """Longest gap allowed between two chunks of a streamed response."""
    request_timeout: PositiveDuration = 600.0
    """Bound on a whole request, across every fallback attempt."""
    timeout: PositiveDuration = 120.0
    """Per-attempt default when neither the rule nor the backend sets one."""
    quarantine: Duration = 15.0
    """How long a backend that failed stays out of rotation before one trial request."""
    api_keys: ApiKeys | None = None
    """Client API keys; when set, every request needs one as a Bearer token."""


class PoolRef(_Model):
    name: Name
    """The pool."""
    member: Name
    """The member of that pool."""


class Backend(_Model):
    name: Name
    """Unique backend name; rules and ``defaultRoute`` refer to it."""
    address: str
    """Base URL of the upstream server (http:// or https://)."""
    tier: Tier = Tier.LOCAL
    """Where the upstream runs."""
    model: str | None = None
    """Model name sent upstream in place of the client's (unset: unchanged)."""
    display_name: str | None = None
    """A human-readable name for listings (optional)."""
    timeout: PositiveDuration | None = None
    """Per-attempt wait for the upstream's response headers, counted once the member is
    resident (unset: ``router.timeout``)."""
    credentials_env: str = ""
    """Environment variable holding the upstream's API key (cloud); empty for none."""
    pool: PoolRef | None = None
    """The pool member this backend fronts; unset for an always-available backend."""

    @field_validator("address")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value).rstrip("/")


class SimDriver(_Model):
    kind: Literal["sim"]
    """Members are sim backends (``hotseat-sim``)."""
    gpu_memory_gi_b: float = Field(default=24.0, gt=0, alias="gpuMemoryGiB", strict=True)
    """Simulated GPU memory the members share, in GiB; a load beyond it fails."""


class ProcessDriver(_Model):
    kind: Literal["process"]
    """Members are local processes, started to load and stopped to unload."""
    stop_grace_period: Duration = 10.0
    """How long a stopping process may take to exit before it is killed."""
    ready_timeout: PositiveDuration | None = None
    """How long a started process may take to answer its health URL (optional)."""
    data_dir: str | None = None
    """Directory of each member's pid file and default log file (unset:
    ``$XDG_STATE_HOME/hotseat``, else ``~/.local/state/hotseat``)."""


class HttpDriver(_Model):
    kind: Literal["http"]
    """Members are loaded and unloaded by calling URLs (vLLM sleep/wake, Ollama)."""
    request_timeout: PositiveDuration = 30.0
    """Timeout of each load, unload and health call."""


class KubernetesDriver(_Model):
    kind: Literal["kubernetes"]
    """Members are workloads scaled between 0 and 1 replica."""
    namespace: str = "default"
    """Namespace of the members' workloads."""
    kubeconfig: str | None = None
    """Kubeconfig file (unset: the pod's service account inside a cluster, else
    ``$KUBECONFIG``, else ``~/.kube/config``)."""
    context: str | None = None
    """Kubeconfig context to use (unset: the file's current context)."""
    request_timeout: PositiveDuration = 10.0
    """Timeout of each Kubernetes API call and each ``/slots`` call."""


Driver = Annotated[
    SimDriver | ProcessDriver | HttpDriver | KubernetesDriver,
    Field(discriminator="kind"),
]


class SimMember(_Model):
    load_seconds: float = Field(default=2.0, ge=0, strict=True)
    """Seconds a load takes."""
    unload_seconds: float = Field(default=0.2, ge=0, strict=True)
    """Seconds an unload takes."""
    memory_gi_b: float = Field(default=6.0, gt=0, alias="memoryGiB", strict=True)
    """Simulated GPU memory the member holds while resident, in GiB."""
    tokens_per_second: float = Field(default=50.0, gt=0, strict=True)
    """Generation speed; a request produces ``max_tokens`` tokens (default 16)."""
    slots: int = Field(default=4, ge=1, strict=True)
    """Requests served at once, as reported by ``/slots``."""
    prefill_tokens_per_second: float | None = Field(default=None, gt=0, strict=True)
    """Prompt evaluation speed: a request waits for the tokens of its prompt that its slot
    has not cached, at this rate, before its first token (unset: no prefill time)."""
    cache_bytes_per_token: int = Field(default=131072, ge=1, strict=True)
    """Bytes one cached token takes in a saved slot file (the default is the KV cache of a
    Llama-3-8B in F16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes)."""
    cache_io_bytes_per_second: float = Field(default=2e9, gt=0, strict=True)
    """How fast a slot is saved to or restored from its file."""


class ProcessMember(_Model):
    command: tuple[str, ...] = Field(min_length=1)
    """The command line that starts the member's server, e.g. ``[llama-server, -m, ...]``."""
    health_url: str | None = None
    """Defaults to the fronting backend's address + ``/health``."""
    slots_url: str | None = None
    """llama.cpp-style ``/slots`` URL, consulted when ``busySignal: leasesAndSlots``."""
    env: dict[str, str] = {}
    """Extra environment variables of the process."""
    cwd: str | None = None
    """Working directory of the process."""
    log_file: str | None = None
    """File that receives the process's output."""


class LoadedCheck(_Model):
    """A JSON answer that says whether a member is loaded, for servers whose health URL
    answers 200 either way (a sleeping vLLM, an Ollama server)."""

    url: HttpUrl
    """URL answering JSON (vLLM ``/is_sleeping``, Ollama ``/api/ps``)."""
    field: str = Field(min_length=1)
    """Where to look: dotted keys, ``[]`` for every item of a list (``is_sleeping``,
    ``models[].name``)."""
    equals: bool | int | float | str | None
    """The value that means loaded; the member is loaded when any value at ``field``
    equals it (``false`` for vLLM's ``is_sleeping``, the model's full name for Ollama)."""


class HttpMember(_Model):
    load_url: HttpUrl
    """URL called to load the member (e.g. vLLM's ``/wake_up``)."""
    unload_url: HttpUrl
    """URL called to unload the member (e.g. vLLM's ``/sleep``)."""
    health_url: str | None = None
    """URL that answers 200 once the member is ready."""
    slots_url: str | None = None
    """llama.cpp-style ``/slots`` URL, consulted when ``busySignal: leasesAndSlots``."""
    method: Literal["POST", "PUT", "GET"] = "POST"
    """HTTP method of the load and unload calls."""
    load_body: dict[str, object] | None = None
    """JSON body of the load call."""
    unload_body: dict[str, object] | None = None
    """JSON body of the unload call."""
    loaded_check: LoadedCheck | None = None
    """When set, the member is ready only when its health URL answers 200 and this check
    passes, and unloaded once the check fails."""


class KubernetesMember(_Model):
    workload: Literal["Deployment", "StatefulSet"] = "Deployment"
    """Kind of the workload that is scaled."""
    name: Name
    """Name of the workload."""
    namespace: str | None = None
    """Namespace of the workload (unset: the driver's ``namespace``)."""
    slots_port: int | None = Field(default=None, ge=1, le=65535, strict=True)
    """Port of the pods' ``/slots`` (unset: the container port named ``http``, else the
    first container port declared)."""


class MemberCache(_Model):
    """Carry the member's prompt cache over swaps: llama.cpp slot save before its unload,
    restore after its load (docs/llama.md; ADR 0007)."""

    carry_over: bool = False
    """Save every non-empty slot before an unload, restore them after the next load."""
    directory: str | None = Field(default=None, alias="dir")
    """The member's own directory of saved slots, the server's ``--slot-save-path``
    (unset: ``<dataDir>/<pool>/slots/<member>``; required for ``http`` members)."""
    max_bytes: ByteSize | None = None
    """Disk budget of the member's saved slots (``20GiB``); the least recently used are
    dropped first (unset: one file per slot, no other bound)."""
    save_timeout: PositiveDuration = 10.0
    """Longest time saving may add to an unload; past it the save is given up."""
    restore_timeout: PositiveDuration = 30.0
    """Longest time restoring may add to a load; past it the restore is given up."""
    model_file: str | None = None
    """The model file whose identity keys the saved slots (unset for ``process`` members:
    the command's ``-m``/``--model``; required for ``http`` members)."""


class PoolMember(_Model):
    name: Name
    """Member name, unique within its pool."""
    memory_gi_b: float | None = Field(default=None, gt=0, alias="memoryGiB", strict=True)
    """GPU memory the member holds while loaded, in GiB (required, and only allowed, in a
    pool with ``capacity``)."""
    pinned: bool = False
    """Keep the member resident: loaded at start, never evicted (a pool with ``capacity``
    only)."""
    preload: bool = False
    """Load the member when a controller starts, if it fits beside the residents without
    evicting any; unlike ``pinned`` it may then be evicted or idle-unloaded, and is not
    loaded again until a controller starts (a pool with ``capacity`` only)."""
    sim: SimMember | None = None
    """Sim settings (``driver.kind: sim``; optional)."""
    process: ProcessMember | None = None
    """How to run the member (required when ``driver.kind: process``)."""
    http: HttpMember | None = None
    """How to load and unload the member (required when ``driver.kind: http``)."""
    kubernetes: KubernetesMember | None = None
    """The member's workload (required when ``driver.kind: kubernetes``)."""
    idle_unload_after: PositiveDuration | None = None
    """This member's own ``idleUnloadAfter`` (unset: the pool's)."""
    cache: MemberCache | None = None
    """Prompt-cache carry-over across swaps (``process``, ``http`` and ``sim`` drivers)."""


class PoolCache(_Model):
    max_bytes: ByteSize | None = None
    """Disk budget of the saved slots of all the pool's members together; the least
    recently used are dropped first (unset: only the members' own budgets)."""


class Device(_Model):
    name: Name
    """The device's name (for the reader: ``cuda0``)."""
    memory_gi_b: float = Field(gt=0, alias="memoryGiB", strict=True)
    """Memory of the device the pool's members may use, in GiB."""


class Capacity(_Model):
    """The memory a pool's members share: several members are resident at once while their
    ``memoryGiB`` fit in it (docs/adr/0008). Give ``gpuMemoryGiB`` or ``devices``."""

    gpu_memory_gi_b: float | None = Field(default=None, gt=0, alias="gpuMemoryGiB", strict=True)
    """The memory the members share, in GiB."""
    devices: tuple[Device, ...] = ()
    """The devices the members share; their memory adds up (a model may be split across
    them, as llama.cpp's ``--tensor-split`` does)."""

    @property
    def total_gib(self) -> float:
        """The memory the members share, in GiB."""
        if self.gpu_memory_gi_b is not None:
            return self.gpu_memory_gi_b
        return sum(d.memory_gi_b for d in self.devices)


class Pool(_Model):
    name: Name
    """Unique pool name: one GPU (or set of GPUs) that holds one member at a time, or,
    with ``capacity``, as many as fit in its memory."""
    swap_budget: Duration = 300.0
    """How long a request may be held for its member; then 503 with Retry-After."""
    swap_timeout: PositiveDuration = 600.0
    """Hard deadline of one swap; past it the swap fails and the target is unloaded."""
    max_waiters: int = Field(default=1000, ge=1, strict=True)
    """Requests held per pool; beyond it the backend is skipped."""
    swap_policy: SwapPolicy = SwapPolicy.STICKY
    """Which member gets the GPU next (``sticky``: the resident keeps it while it has demand)."""
    default: Name | None = None
    """Member loaded when the pool is cold (optional)."""
    capacity: Capacity | None = None
    """The pool's memory: members whose ``memoryGiB`` fit in it are resident together, and
    a member that does not fit evicts idle ones (unset: one resident at a time)."""
    busy_signal: BusySignal = BusySignal.LEASES
    """What makes a member busy: live leases, or leases and the backend's ``/slots``."""
    lease_ttl: PositiveDuration = 15.0
    """How long a lease lives without renewal; a dead router's lease expires after it."""
    swap_failure_backoff: Duration = 5.0
    """After a failed swap, acquires for that member fail fast for this long."""
    max_wait: PositiveDuration | None = None
    """Once a request for another member has waited this long, new requests for the busy
    resident wait behind it, so the resident drains and the pool swaps (unset: the
    resident keeps the GPU while it has demand)."""
    min_residency: Duration | None = None
    """How long a new resident stays before ``maxWait`` may close it for a request that
    came after it (unset: twice the pool's mean measured swap time, at least 1s); a
    request already in line when it became resident (or ranked so by its priority) is
    bounded by ``maxWait`` alone; an idle resident is swapped at once whatever its age."""
    priority_aging: PositiveDuration = 10.0
    """A waiting request of priority ``p`` ranks as if it had waited ``p`` times this much
    longer, so a low priority request moves up one level for every such span it waits."""
    thrash_window: Duration = 60.0
    """A swap back to the member resident before the current one, sooner than this after
    the current one came in, is counted and audited as a swap back."""
    idle_unload_after: PositiveDuration | None = None
    """Unload a resident that served nothing for this long, or load the ``default`` member
    in its place (unset: never); a member's own setting overrides it."""
    driver: Driver = SimDriver(kind="sim")
    """How members are loaded and unloaded, chosen by ``kind``."""
    cache: PoolCache = PoolCache()
    """The pool's budget for its members' saved prompt caches."""
    members: tuple[PoolMember, ...] = Field(min_length=1)
    """The models that take turns in this pool."""

    def member(self, name: str) -> PoolMember | None:
        return next((m for m in self.members if m.name == name), None)


class GroupMember(_Model):
    backend: Name
    """A pooled backend that serves the group's model on its pool."""
    slots: int = Field(default=1, ge=1, strict=True)
    """Requests one copy serves at once before it counts as full (the server's parallel
    slots: llama.cpp's ``--parallel``, the sim's ``slots``)."""


class ModelGroup(_Model):
    """One model served by several pools: a rule that names the group gets one placement
    among its members' pools (docs/adr/0012)."""

    name: Name
    """The group's name, which a rule's ``route.backends`` may name (unique among the
    backends' and groups' names)."""
    max_copies: int = Field(default=1, ge=1, strict=True)
    """How many pools may hold the model resident for the group's demand: a further copy
    is loaded only once every copy is full."""
    members: tuple[GroupMember, ...] = Field(min_length=1)
    """The pooled backends that serve the model, at most one per pool."""

    def member(self, backend: str) -> GroupMember | None:
        return next((m for m in self.members if m.backend == backend), None)


class RuleMatch(_Model):
    models: tuple[str, ...] = ()
    """Requested model names this rule serves (``*`` matches any text)."""
    headers: dict[str, str] = {}
    """Request headers and the values they must have."""
    data_classification: tuple[str, ...] = ()
    """Data classification labels this rule serves."""


class RuleRoute(_Model):
    backends: tuple[Name, ...] = Field(min_length=1)
    """Backends (or model groups) to try, in order of preference."""
    pool_activation: PoolActivation = PoolActivation.WAIT
    """When a pooled backend's member is not resident and the incumbent is busy: ``Wait``
    for the swap, or ``IfIdle``: skip to the next backend."""


MAX_PRIORITY = 1000


class PriorityHeader(_Model):
    """Whether a request may set its own priority with ``x-hotseat-priority``."""

    allow: bool = False
    """Read the header (unset or false: it is ignored)."""
    max: int = Field(default=10, ge=0, le=MAX_PRIORITY, strict=True)
    """The highest priority a request may ask for; a higher value is lowered to it."""


class Rule(_Model):
    name: Name
    """Unique rule name."""
    match: RuleMatch = RuleMatch()
    """Which requests the rule serves."""
    route: RuleRoute
    """Where those requests go."""
    timeout: PositiveDuration | None = None
    """Per-attempt timeout for this rule's requests (optional)."""
    priority: int = Field(default=0, ge=0, le=MAX_PRIORITY, strict=True)
    """How urgent this rule's held requests are: a higher one is swapped in first (see
    the pool's ``priorityAging``)."""
    priority_header: PriorityHeader = PriorityHeader()
    """Whether the ``x-hotseat-priority`` request header may raise (or lower) it."""
    hold_keep_alive: PositiveDuration | None = None
    """While a streaming request is held for its pool, send its response headers and an
    SSE comment line at this interval, which OpenAI clients ignore (unset: nothing is sent
    until the backend answers)."""


class HotseatConfig(_Model):
    router: RouterPolicy = RouterPolicy()
    """Settings of the router."""
    backends: tuple[Backend, ...] = ()
    """Upstream inference servers."""
    pools: tuple[Pool, ...] = ()
    """GPU pools whose members take turns."""
    rules: tuple[Rule, ...] = ()
    """Routing rules."""
    model_groups: tuple[ModelGroup, ...] = ()
    """Models served by several pools, each placed per request (docs/adr/0012)."""
    default_route: Name | None = None
    """Backend for requests that no rule matches (optional); for a model that no rule
    names only with ``unknownModels: DefaultRoute``."""
    default_route_strategy: DefaultRouteStrategy = DefaultRouteStrategy.STATIC
    """How requests that no rule matches are routed."""
    unknown_models: UnknownModels = UnknownModels.REFUSE
    """A request for a model that no rule's ``match.models`` names (nor, with
    ``BackendNameMatch``, a backend): ``Refuse`` it with 404 ``model_not_found``, or send
    it to ``defaultRoute`` (``DefaultRoute``)."""

    def backend(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)

    def group(self, name: str) -> ModelGroup | None:
        return next((g for g in self.model_groups if g.name == name), None)

    def member_backend(self, pool: str, member: str) -> Backend | None:
        """The backend that fronts ``pool``/``member``, if any."""
        return next(
            (
                b
                for b in self.backends
                if b.pool is not None and b.pool.name == pool and b.pool.member == member
            ),
            None,
        )
