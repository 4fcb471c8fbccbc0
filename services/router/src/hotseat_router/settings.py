"""The router's settings: every :class:`ServiceSettings` field plus the router's own."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from hotseat_common.config.model import HotseatConfig
from hotseat_common.settings import ServiceSettings, SettingDuration
from hotseat_router.body import MAX_JSON_DEPTH
from hotseat_router.connection import ConnectionLimits


class RouterSettings(ServiceSettings):
    """``HOTSEAT_*`` variables (and the matching flags) read by ``hotseat-router``."""

    workers: int = Field(default=1, ge=1, description="Worker processes")
    api_keys: SecretStr | None = Field(
        default=None, description="Client API keys, comma-separated (adds to the config's)"
    )
    api_keys_file: Path | None = Field(
        default=None, description="File of client API keys, one per line (adds to the config's)"
    )
    upstream_connections: int = Field(
        default=1024,
        ge=1,
        description="Most connections open at once per upstream, idle keep-alive ones included",
    )
    upstream_keepalive: float = Field(
        default=4.0, gt=0, description="Seconds an idle upstream connection stays pooled"
    )
    max_json_depth: int = Field(
        default=128,
        ge=1,
        le=MAX_JSON_DEPTH,
        description="Deepest nesting of a request body's JSON (deeper: 400)",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Largest request head (request line and headers) in bytes (larger: 431)",
    )
    max_headers: int = Field(
        default=100, ge=8, description="Most headers in one request (more: 431)"
    )
    header_timeout: SettingDuration = Field(
        default=10.0,
        gt=0,
        description="Seconds a client has to send a request's headers (later: 408, closed)",
    )
    body_timeout: SettingDuration = Field(
        default=60.0,
        gt=0,
        description="Seconds a client has to send a request's whole body (later: 408)",
    )
    write_timeout: SettingDuration = Field(
        default=30.0,
        gt=0,
        description="Seconds a client may leave its response unread with the router's"
        " buffer for it full (then it is dropped, its lease released)",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Most open client connections per router process (more: 503)",
    )
    body_budget_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="Request body bytes one router process buffers at once, all requests"
        " together (more: 503)",
    )
    health_failures: int = Field(
        default=3,
        ge=1,
        description="Failed requests, none served between them, that quarantine a backend",
    )
    health_window: SettingDuration = Field(
        default=30.0, gt=0, description="Seconds within which those failures must fall"
    )
    health_clients: int = Field(
        default=2,
        ge=1,
        description="Distinct clients among them, unless every one failed to connect",
    )
    access_log: bool = Field(
        default=False,
        description="Write one log line per request (event `access`) when it ends",
    )
    audit_buffer: int = Field(
        default=10_000, ge=1, description="Audit events held while NATS is unreachable"
    )


def connection_limits(settings: RouterSettings) -> ConnectionLimits:
    return ConnectionLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout=settings.header_timeout,
        max_connections=settings.max_connections,
        write_timeout=settings.write_timeout,
    )


def router_name(settings: RouterSettings, config: HotseatConfig) -> str:
    """The ``router`` label and audit field, and the router's name at the pool controller:
    this replica's instance name, else the config's."""
    return settings.instance or config.router.name
