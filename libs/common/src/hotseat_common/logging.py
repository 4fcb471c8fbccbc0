"""Structured logs: one JSON object per line (or a readable console form), with
request-scoped fields carried in ``contextvars`` (``bind_contextvars(request_id=...)``)."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

get_logger = structlog.stdlib.get_logger


def configure_logging(
    service: str,
    *,
    level: str = "info",
    fmt: Literal["json", "console"] = "json",
    instance: str | None = None,
) -> None:
    """Route structlog and stdlib logging (uvicorn, nats) to stderr in one format."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Access logs are per request and duplicate our own request log line; httpx logs every
    # health and /slots probe a driver makes at info level.
    for chatty in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, instance=instance or service)
