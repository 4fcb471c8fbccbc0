"""Typed settings from ``HOTSEAT_*`` environment variables, overridden by command-line flags.

Every field of a settings class becomes a flag of the same name (``nats_url`` ->
``--nats-url``), so each flag mirrors exactly one variable (``HOTSEAT_NATS_URL``, or the
field's validation alias when it has one, e.g. ``dsn`` read from ``HOTSEAT_AUDIT_DSN``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import BeforeValidator, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from hotseat_common.durations import parse_duration
from hotseat_common.keys import DEFAULT_KEY_PREFIX
from hotseat_common.subjects import DEFAULT_AUDIT_STREAM, DEFAULT_PREFIX

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


class ServiceSettings(BaseSettings):
    """What every Hotseat service reads."""

    model_config = SettingsConfigDict(env_prefix="HOTSEAT_", extra="ignore", frozen=True)

    config: Path | None = Field(default=None, description="Path of the Hotseat YAML config")
    host: str = Field(default="127.0.0.1", description="Address to listen on")
    port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on")
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server URL(s)")
    nats_user: str | None = Field(default=None, description="NATS user name")
    nats_password: SecretStr | None = Field(default=None, description="NATS password")
    nats_token: SecretStr | None = Field(default=None, description="NATS token")
    nats_creds: Path | None = Field(default=None, description="NATS credentials file")
    nats_tls_ca: Path | None = Field(default=None, description="CA bundle for NATS TLS")
    subject_prefix: str = Field(default=DEFAULT_PREFIX, description="Prefix of NATS subjects")
    audit_stream: str = Field(default=DEFAULT_AUDIT_STREAM, description="JetStream audit stream")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info")
    log_format: Literal["json", "console"] = Field(default="json")
    shutdown_grace: float = Field(
        default=30.0, ge=0, description="Seconds in-flight work may take to finish on SIGTERM"
    )
    instance: str | None = Field(
        default=None, description="Name of this replica in logs, metrics and audit events"
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="Proxies trusted to name the client (X-Forwarded-For, X-Forwarded-Proto):"
        " addresses or networks, comma-separated, or * for any; unset: those headers are"
        " ignored and the client is the connection's peer",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP endpoint to export traces to (e.g. http://127.0.0.1:4318;"
        " needs the otel extra); unset: no traces",
    )


class RedisSettings(BaseSettings):
    """Mixed into services that use Redis."""

    model_config = SettingsConfigDict(env_prefix="HOTSEAT_", extra="ignore", frozen=True)

    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Redis URL")
    redis_password: SecretStr | None = Field(default=None, description="Redis password")
    redis_tls_ca: Path | None = Field(default=None, description="CA bundle for Redis TLS")
    redis_sentinels: str | None = Field(
        default=None,
        description="Redis Sentinels, host:port comma-separated: the primary is asked of them"
        " (and again after a failover); the URL then gives only the scheme, user, password"
        " and database",
    )
    redis_sentinel_master: str = Field(
        default="hotseat", description="Name of the primary the Sentinels monitor"
    )
    redis_sentinel_password: SecretStr | None = Field(
        default=None, description="Password of the Sentinels themselves (if they need one)"
    )
    key_prefix: str = Field(default=DEFAULT_KEY_PREFIX, description="Prefix of Redis keys")


def _setting_duration(value: object) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(float(value))
        except ValueError:
            pass
    return parse_duration(value)


SettingDuration = Annotated[float, BeforeValidator(_setting_duration)]
"""Seconds from a flag or variable, written as plain seconds (``300``) or a duration
(``300s``, ``2m``, ``1h30m``)."""


def _flag_type(annotation: Any, metadata: Sequence[Any] = ()) -> Any:
    if any(isinstance(m, BeforeValidator) and m.func is _setting_duration for m in metadata):
        return str  # parsed by the model, so "2m" works as well as "120"
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return str
    if args and len(args) == 1:
        return _flag_type(args[0])
    if annotation in (int, float):
        return annotation
    return str


def load_settings(
    cls: type[SettingsT], argv: Sequence[str] | None = None, *, prog: str, description: str
) -> SettingsT:
    """Build ``cls`` from the environment with any command-line flag taking precedence."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name, field in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        alias = field.validation_alias
        env = alias if isinstance(alias, str) else "HOTSEAT_" + name.upper()
        choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else None
        parser.add_argument(
            flag,
            dest=name,
            type=_flag_type(field.annotation, field.metadata),
            choices=choices,
            default=None,
            help=f"{field.description or name} (env {env})",
        )
    args = parser.parse_args(argv)
    # A field read from a variable other than HOTSEAT_<FIELD> (its validation alias) is
    # passed under that alias, so the flag wins over the variable like everywhere else.
    overrides = {
        alias if isinstance(alias := cls.model_fields[k].validation_alias, str) else k: v
        for k, v in vars(args).items()
        if v is not None
    }
    return cls(**overrides)
