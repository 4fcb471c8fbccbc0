"""Base of every message that crosses a process: frozen, strict, versioned."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A versioned wire message; unknown fields are rejected so drift shows at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    """Protocol version; bumped with :data:`hotseat_common.PROTOCOL_VERSION`."""

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        return cls.model_validate_json(data)
