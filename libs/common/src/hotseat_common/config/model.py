"""The configuration schema: one YAML file shared by every Hotseat component.

Field names follow the LLMKube ModelRouter/ModelPool resources (camelCase on the
wire, snake_case in Python). Durations are seconds parsed from strings like ``300s``.
Cross-references between sections are checked in :mod:`hotseat_common.config.checks`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from hotseat_common.durations import Duration

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
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


class ClassificationPolicy(_Model):
    header_key: str = "x-hotseat-classification"
    sensitive: tuple[str, ...] = ("pii", "phi")


class ApiKeys(_Model):
    """Where client API keys come from: an env var and/or a file, one key per line."""

    env: str | None = None
    file: str | None = None


class RouterPolicy(_Model):
    name: Name = "default"
    classification: ClassificationPolicy = ClassificationPolicy()
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    stream_idle_timeout: Duration = 300.0
    request_timeout: Duration = 600.0
    timeout: Duration = 120.0
    """Per-attempt default when neither the rule nor the backend sets one."""
    quarantine: Duration = 15.0
    """How long a backend that failed stays out of rotation before one trial request."""
    api_keys: ApiKeys | None = None


class PoolRef(_Model):
    name: Name
    member: Name


class Backend(_Model):
    name: Name
    address: str
    tier: Tier = Tier.LOCAL
    model: str | None = None
    display_name: str | None = None
    timeout: Duration | None = None
    credentials_env: str = ""
    pool: PoolRef | None = None

    @field_validator("address")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value.rstrip("/")


class SimDriver(_Model):
    kind: Literal["sim"]
    gpu_memory_gi_b: float = Field(default=24.0, gt=0, alias="gpuMemoryGiB")


class ProcessDriver(_Model):
    kind: Literal["process"]
    stop_grace_period: Duration = 10.0
    ready_timeout: Duration | None = None


class HttpDriver(_Model):
    kind: Literal["http"]
    request_timeout: Duration = 30.0


class KubernetesDriver(_Model):
    kind: Literal["kubernetes"]
    namespace: str = "default"


Driver = Annotated[
    SimDriver | ProcessDriver | HttpDriver | KubernetesDriver,
    Field(discriminator="kind"),
]


class SimMember(_Model):
    load_seconds: float = Field(default=2.0, ge=0)
    unload_seconds: float = Field(default=0.2, ge=0)
    memory_gi_b: float = Field(default=6.0, gt=0, alias="memoryGiB")
    tokens_per_second: float = Field(default=50.0, gt=0)
    slots: int = Field(default=4, ge=1)


class ProcessMember(_Model):
    command: tuple[str, ...] = Field(min_length=1)
    health_url: str | None = None
    """Defaults to the fronting backend's address + ``/health``."""
    slots_url: str | None = None
    env: dict[str, str] = {}
    cwd: str | None = None
    log_file: str | None = None


class HttpMember(_Model):
    load_url: str
    unload_url: str
    health_url: str | None = None
    slots_url: str | None = None
    method: Literal["POST", "PUT", "GET"] = "POST"
    load_body: dict[str, object] | None = None
    unload_body: dict[str, object] | None = None


class KubernetesMember(_Model):
    workload: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: Name
    namespace: str | None = None


class PoolMember(_Model):
    name: Name
    sim: SimMember | None = None
    process: ProcessMember | None = None
    http: HttpMember | None = None
    kubernetes: KubernetesMember | None = None


class Pool(_Model):
    name: Name
    swap_budget: Duration = 300.0
    swap_timeout: Duration = 600.0
    max_waiters: int = Field(default=1000, ge=1)
    swap_policy: SwapPolicy = SwapPolicy.STICKY
    default: Name | None = None
    busy_signal: BusySignal = BusySignal.LEASES
    lease_ttl: Duration = 15.0
    """How long a lease lives without renewal; a dead router's lease expires after it."""
    swap_failure_backoff: Duration = 5.0
    """After a failed swap, acquires for that member fail fast for this long."""
    driver: Driver = SimDriver(kind="sim")
    members: tuple[PoolMember, ...] = Field(min_length=1)

    def member(self, name: str) -> PoolMember | None:
        return next((m for m in self.members if m.name == name), None)


class RuleMatch(_Model):
    models: tuple[str, ...] = ()
    headers: dict[str, str] = {}
    data_classification: tuple[str, ...] = ()


class RuleRoute(_Model):
    backends: tuple[Name, ...] = Field(min_length=1)
    pool_activation: PoolActivation = PoolActivation.WAIT


class Rule(_Model):
    name: Name
    match: RuleMatch = RuleMatch()
    route: RuleRoute
    timeout: Duration | None = None


class HotseatConfig(_Model):
    router: RouterPolicy = RouterPolicy()
    backends: tuple[Backend, ...] = ()
    pools: tuple[Pool, ...] = ()
    rules: tuple[Rule, ...] = ()
    default_route: Name | None = None
    default_route_strategy: DefaultRouteStrategy = DefaultRouteStrategy.STATIC

    def backend(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)

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
