"""The sim's settings: every service setting, Redis, and which backend of the config it is."""

from __future__ import annotations

from pydantic import Field

from hotseat_common.settings import RedisSettings, ServiceSettings


class SimSettings(ServiceSettings, RedisSettings):
    """``hotseat-sim`` settings (``HOTSEAT_*`` variables, overridden by flags)."""

    backend: str | None = Field(
        default=None, description="Name of the config backend this sim serves (required)"
    )
    loaded: bool = Field(
        default=False, description="Start with the model already loaded (unpooled backends, demos)"
    )
    load_on_start: bool = Field(
        default=False,
        description="Begin loading at start-up and be ready after loadSeconds, like a "
        "llama-server process (for the process driver)",
    )
    ledger_max_entries: int = Field(
        default=200_000, ge=1000, description="Approximate cap on the GPU ledger stream length"
    )
