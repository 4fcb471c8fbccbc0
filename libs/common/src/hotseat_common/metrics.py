"""Prometheus metrics: every metric name Hotseat exports, built on an injected registry.

Each service creates its metric set in its lifespan with its own
``CollectorRegistry``; nothing is registered at import time.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)

Metric = TypeVar("Metric", Counter, Gauge, Histogram)


class Series(Generic[Metric]):
    """A labelled metric's series, each looked up once (``series(*labels)``) where a
    request's path would otherwise ask prometheus-client for it every time. For labels
    the config bounds (router, rule, backend, API key): the cache grows no larger."""

    __slots__ = ("_metric", "_series")

    def __init__(self, metric: Metric) -> None:
        self._metric: Metric = metric
        self._series: dict[tuple[str, ...], Metric] = {}

    def __call__(self, *labels: str) -> Metric:
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = self._metric.labels(*labels)
        return found


class AuditPublishMetrics:
    """The publishing side of audit events (router and controller)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dropped = Counter(
            "hotseat_audit_events_dropped_total",
            "Audit events dropped because the publish buffer was full.",
            registry=registry,
        )
        self.buffered = Gauge(
            "hotseat_audit_events_buffered",
            "Audit events waiting to be published.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.published = Counter(
            "hotseat_audit_events_published_total",
            "Audit events acknowledged by JetStream.",
            registry=registry,
        )
        self.batches = Counter(
            "hotseat_audit_publish_batches_total",
            "Batches of audit events published (their events' acks awaited together).",
            registry=registry,
        )


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "hotseat_router_requests_total",
            "Requests by rule, backend and terminal outcome.",
            ["router", "rule", "backend", "outcome"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "hotseat_router_request_duration_seconds",
            "Whole-request latency, including any pool hold.",
            ["router", "rule", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.time_to_first_byte = Histogram(
            "hotseat_router_time_to_first_byte_seconds",
            "Time from request start to the first response byte from the upstream.",
            ["router", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "hotseat_router_in_flight_requests",
            "Requests currently being handled.",
            ["router"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.backend_healthy = Gauge(
            "hotseat_router_backend_healthy",
            "1 when the backend is in rotation, 0 while quarantined.",
            ["router", "backend"],
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.upstream_attempts = Counter(
            "hotseat_router_upstream_attempts_total",
            "Upstream attempts by backend and result (ok, http_5xx, http_4xx, connect, timeout).",
            ["router", "backend", "result"],
            registry=registry,
        )
        self.busy_skips = Counter(
            "hotseat_pool_busy_skips_total",
            "Backends skipped because their pool's incumbent was busy (IfIdle).",
            ["router", "pool", "member"],
            registry=registry,
        )
        self.pool_hold = Histogram(
            "hotseat_pool_hold_duration_seconds",
            "Time a request was held waiting for its pool member to become resident.",
            ["router", "pool", "member", "result"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.hold_by_priority = Histogram(
            "hotseat_pool_hold_by_priority_seconds",
            "Time a request was held for its pool member, by the request's priority.",
            ["router", "pool", "priority"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.priority_header_ignored = Counter(
            "hotseat_router_priority_header_ignored_total",
            "Requests whose x-hotseat-priority header their rule allows but which was not a"
            " whole number (the rule's priority was used).",
            ["router", "rule"],
            registry=registry,
        )
        self.tokens = Counter(
            "hotseat_router_tokens_total",
            "Tokens the upstreams reported in their answers' usage, by rule, backend, API key"
            " (a short digest; empty without keys) and type (prompt, completion).",
            ["router", "rule", "backend", "api_key", "type"],
            registry=registry,
        )
        self.held = Gauge(
            "hotseat_pool_held_requests",
            "Requests currently held waiting for a pool member.",
            ["router", "pool", "member"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.audit_publish = AuditPublishMetrics(registry)


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.swaps = Counter(
            "hotseat_pool_swaps_total",
            "Swaps by pool, from, to and result (completed, failed, cancelled).",
            ["pool", "from_member", "to_member", "result"],
            registry=registry,
        )
        self.swaps_started = Counter(
            "hotseat_pool_swaps_started_total",
            "Swaps started by pool, target and reason (demand, swap_back, admin,"
            " admin_unload, warm_default, preload, idle_unload, return_to_default).",
            ["pool", "to_member", "reason"],
            registry=registry,
        )
        self.swap_retargets = Counter(
            "hotseat_pool_swap_retargets_total",
            "Swaps that turned, still unloading, from their target to a more urgent member"
            " before their load (docs/adr/0006).",
            ["pool", "from_target", "to_member"],
            registry=registry,
        )
        self.swap_duration = Histogram(
            "hotseat_pool_swap_duration_seconds",
            "Duration of swaps from the start of the unload to the target ready.",
            ["pool", "to_member", "result"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.resident = Gauge(
            "hotseat_pool_resident",
            "1 for the resident member of each pool (every member of a capacity pool's"
            " residency set).",
            ["pool", "member"],
            registry=registry,
        )
        self.memory_free = Gauge(
            "hotseat_pool_memory_free_gib",
            "A capacity pool's memory not held by a resident, a member loading or one being"
            " unloaded, in GiB.",
            ["pool"],
            registry=registry,
        )
        self.leases_live = Gauge(
            "hotseat_pool_leases_live",
            "Live activation leases per member, fleet-wide (a router shares one lease among"
            " its concurrent requests for a member).",
            ["pool", "member"],
            registry=registry,
        )
        self.waiters = Gauge(
            "hotseat_pool_waiters",
            "Requests held per member, fleet-wide.",
            ["pool", "member"],
            registry=registry,
        )
        self.lease_expiries = Counter(
            "hotseat_pool_lease_expiries_total",
            "Leases reclaimed because their router stopped renewing them.",
            ["pool", "member"],
            registry=registry,
        )
        self.acquires = Counter(
            "hotseat_pool_acquires_total",
            "Acquire answers by pool, member and status (a request that shares its router's"
            " live lease asks nothing).",
            ["pool", "member", "status"],
            registry=registry,
        )
        self.residents_lost = Counter(
            "hotseat_pool_resident_lost_total",
            "Residents found dead out of band.",
            ["pool", "member"],
            registry=registry,
        )
        self.residents_unhealthy = Counter(
            "hotseat_pool_resident_unhealthy_total",
            "Residents that failed their health checks while serving and were kept (not"
            " unloaded) until their leases ended or they answered again.",
            ["pool", "member"],
            registry=registry,
        )
        self.store_relearns = Counter(
            "hotseat_pool_store_relearns_total",
            "Pool states rebuilt because the store lost them (a Redis restart or failover);"
            " the resident then counts as busy while routers renew their leases back.",
            ["pool"],
            registry=registry,
        )
        self.cache_bytes = Counter(
            "hotseat_pool_cache_bytes_total",
            "Bytes of prompt cache saved before unloads and restored after loads (action:"
            " save, restore).",
            ["pool", "member", "action"],
            registry=registry,
        )
        self.cache_tokens = Counter(
            "hotseat_pool_cache_tokens_total",
            "Tokens of prompt cache saved and restored (action: save, restore).",
            ["pool", "member", "action"],
            registry=registry,
        )
        self.cache_duration = Histogram(
            "hotseat_pool_cache_duration_seconds",
            "Time a member's prompt-cache save added to its unload, or its restore to its load.",
            ["pool", "member", "action"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cache_failures = Counter(
            "hotseat_pool_cache_failures_total",
            "Prompt-cache saves and restores that failed or were skipped (reason: unsupported,"
            " busy, timeout, model_changed, error); the swap went on.",
            ["pool", "member", "action", "reason"],
            registry=registry,
        )
        self.cache_files_dropped = Counter(
            "hotseat_pool_cache_files_dropped_total",
            "Saved prompt caches deleted (reason: budget, stale: of another model identity).",
            ["pool", "member", "reason"],
            registry=registry,
        )
        self.audit_publish = AuditPublishMetrics(registry)


class AuditMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "hotseat_audit_events_total",
            "Audit events stored, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "hotseat_audit_dead_letters_total",
            "Messages that could not be parsed and went to the dead-letter store.",
            ["reason"],
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "hotseat_audit_consumer_lag",
            "Messages in the stream not yet delivered to the audit consumer.",
            registry=registry,
        )
        self.store_latency = Histogram(
            "hotseat_audit_store_latency_seconds",
            "Time to commit one batch to the store.",
            ["store"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.retention_deleted = Counter(
            "hotseat_audit_retention_deleted_total",
            "Rows deleted by the retention job.",
            registry=registry,
        )
        self.duplicates = Counter(
            "hotseat_audit_duplicates_total",
            "Events received again after they were stored (redelivered or republished).",
            registry=registry,
        )
