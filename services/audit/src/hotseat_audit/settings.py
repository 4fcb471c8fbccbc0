"""The audit service's settings: everything in :class:`ServiceSettings` plus the store,
retention, stream limits and consumer tuning.

Audit-specific variables are named ``HOTSEAT_AUDIT_<FIELD>`` while the flag stays
``--<field>`` (``HOTSEAT_AUDIT_DSN`` / ``--dsn``), so a generic ``HOTSEAT_DSN`` meant
for something else is never picked up by mistake.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, model_validator

from hotseat_common.audit_stream import AuditStreamSpec
from hotseat_common.settings import ServiceSettings, SettingDuration
from hotseat_common.subjects import AUDIT_DURABLE, Subjects

DEFAULT_DSN = "sqlite:///./.hotseat/audit.db"
DEFAULT_PORT = 8082
DAY = 24 * 3600.0
MIN_CURSOR_KEY = 16
"""Characters a configured cursor key must have at least."""


def _audit(default: Any, description: str, name: str, **constraints: Any) -> Any:
    """A field read from ``HOTSEAT_AUDIT_<NAME>``; ``load_settings`` gives it ``--<name>``."""
    return Field(
        default=default,
        description=description,
        validation_alias=f"HOTSEAT_AUDIT_{name.upper()}",
        **constraints,
    )


class AuditSettings(ServiceSettings):
    """Settings of ``hotseat-audit``."""

    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Port to listen on")
    dsn: str = _audit(
        DEFAULT_DSN,
        "Audit store: sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://...",
        "dsn",
    )
    retention: SettingDuration = _audit(
        30 * DAY, "Delete stored events older than this (e.g. 720h); 0 keeps them", "retention"
    )
    retention_interval: SettingDuration = _audit(
        300.0, "How often the retention job runs", "retention_interval", gt=0
    )
    retention_batch: int = _audit(
        5000, "Rows deleted per retention statement", "retention_batch", ge=1
    )
    stream_max_age: SettingDuration = _audit(
        30 * DAY, "JetStream audit stream: discard messages older than this", "stream_max_age", gt=0
    )
    stream_max_bytes: int = _audit(
        -1, "JetStream audit stream: size limit in bytes (-1: none)", "stream_max_bytes", ge=-1
    )
    duplicate_window: SettingDuration = _audit(
        120.0, "JetStream de-duplication window on Nats-Msg-Id", "duplicate_window", gt=0
    )
    batch_size: int = _audit(
        500, "Messages fetched and committed per transaction", "batch_size", ge=1, le=10_000
    )
    consumer: str = _audit(AUDIT_DURABLE, "Durable consumer name", "consumer", min_length=1)
    ack_wait: SettingDuration = _audit(
        30.0, "Redeliver a message not acknowledged within this time", "ack_wait", gt=0
    )
    cursor_key: SecretStr | None = _audit(
        None,
        "Key that signs pagination cursors; the same on every replica (unset: a random key "
        "per process, so cursors do not survive a restart)",
        "cursor_key",
    )

    @model_validator(mode="after")
    def _window_fits_age(self) -> AuditSettings:
        if self.duplicate_window > self.stream_max_age:
            raise ValueError("duplicate_window must not exceed stream_max_age")
        return self

    def cursor_key_bytes(self) -> bytes | None:
        """The configured cursor key, or None when unset or empty (as an empty variable in
        a compose file gives).

        Checked here rather than by a field validator: pydantic's errors quote the input,
        and this one must never show the key."""
        if self.cursor_key is None or not self.cursor_key.get_secret_value():
            return None
        key = self.cursor_key.get_secret_value()
        if len(key) < MIN_CURSOR_KEY:
            raise ValueError(f"cursor_key must have at least {MIN_CURSOR_KEY} characters")
        return key.encode()

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.subject_prefix)

    def stream_spec(self) -> AuditStreamSpec:
        return AuditStreamSpec(
            name=self.audit_stream,
            subjects=self.subjects,
            max_age_s=self.stream_max_age,
            max_bytes=self.stream_max_bytes,
            duplicate_window_s=self.duplicate_window,
        )
