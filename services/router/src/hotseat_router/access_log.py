"""The optional access log: one line per request, written when its terminal outcome is
recorded (``HOTSEAT_ACCESS_LOG=true``; off by default: the audit trail already keeps
every request, and a line per request costs a busy router real CPU).

The line is the service's log format (JSON, or the console form), event ``access``, on
the logger ``hotseat.access`` (so a log pipeline can route it apart)."""

from __future__ import annotations

from hotseat_common.logging import get_logger
from hotseat_common.messages.audit import RequestOutcome
from hotseat_router.context import RequestContext

log = get_logger("hotseat.access")


def access_line(
    ctx: RequestContext,
    outcome: RequestOutcome,
    *,
    status: int | None,
    duration_ms: float,
    reason: str | None,
) -> None:
    """Write the request's access line; fields that do not apply are left out."""
    usage = ctx.usage
    fields: dict[str, object] = {
        "request_id": ctx.request_id,
        "outcome": outcome.value,
        "status": status,
        "model": ctx.model,
        "rule": ctx.rule,
        "backend": ctx.backend,
        "pool": ctx.pool,
        "member": ctx.member,
        "duration_ms": duration_ms,
        "hold_ms": ctx.hold_ms() if ctx.held_s else None,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "completion_tokens": usage.completion_tokens if usage is not None else None,
        "api_key": ctx.api_key,
        "swap_id": ctx.swap_id,
        "reason": reason,
    }
    log.info("access", **{k: v for k, v in fields.items() if v is not None})
