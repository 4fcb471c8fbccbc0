"""The audit service as an ASGI app: the lifespan owns the store, NATS, the consumer and
the retention job.

Start-up: open and migrate the store, connect to NATS, create or update the stream,
create or update the durable consumer and bind to it; then readiness turns true.

Shutdown (SIGTERM/SIGINT, after uvicorn stops taking requests):

1. readiness turns false;
2. the consumer stops fetching, commits and acknowledges the batch in hand (bounded by
   ``shutdown_grace``; a batch still unfinished then is left unacknowledged and is
   redelivered to the next consumer, never lost);
3. the retention job stops between batches;
4. the fetch inbox is removed (messages fetched but not handled are handed back) and
   NATS drained, so the last acknowledgements reach the server;
5. the store is closed, and one line tallies what this process did.

A background loop that dies unexpectedly marks the service failed and stops it, so the
process exits non-zero instead of serving queries while ingest is dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from collections.abc import AsyncIterator, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypedDict

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from hotseat_audit.api import build_router, install_error_handlers
from hotseat_audit.consumer import AuditConsumer
from hotseat_audit.retention import RetentionJob
from hotseat_audit.settings import AuditSettings
from hotseat_audit.store import AuditStore, open_store, parse_dsn
from hotseat_common.api_docs import serve_api_docs
from hotseat_common.audit_stream import ensure_audit_stream
from hotseat_common.connections import connect_nats
from hotseat_common.logging import get_logger
from hotseat_common.metrics import AuditMetrics
from hotseat_common.service import Readiness, ops_router

log = get_logger(__name__)


class State(TypedDict):
    store: AuditStore


@dataclass
class Supervisor:
    """Background loops of the service; the first unexpected death stops the process."""

    failed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_done)
        self.tasks.append(task)
        return task

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.failed = True
        log.critical("audit_loop_died", loop=task.get_name(), exc_info=task.exception())
        signal.raise_signal(signal.SIGTERM)  # uvicorn's handler runs the graceful shutdown

    async def wait(self, task: asyncio.Task[None], timeout: float) -> bool:
        """Wait for ``task`` to finish; cancel it after ``timeout``. True if it finished."""
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False


def cursor_key(settings: AuditSettings) -> bytes:
    """The configured cursor key, or a random one for this process (logged: its cursors
    stop working at a restart and on every other replica)."""
    configured = settings.cursor_key_bytes()
    if configured is not None:
        return configured
    log.warning(
        "audit_cursor_key_generated",
        detail="HOTSEAT_AUDIT_CURSOR_KEY is not set: pagination cursors are signed with a "
        "random key and will not survive a restart or work across replicas",
    )
    return secrets.token_bytes(32)


def create_app(settings: AuditSettings) -> tuple[FastAPI, Supervisor]:
    """The app and its supervisor (``main`` reads ``supervisor.failed`` for the exit code)."""
    registry = CollectorRegistry()
    metrics = AuditMetrics(registry)
    readiness = Readiness()
    supervisor = Supervisor()
    target = parse_dsn(settings.dsn)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[State]:
        async with AsyncExitStack() as stack:
            store = await open_store(target)
            stack.push_async_callback(store.close)
            version = await store.migrate()
            log.info("audit_store_ready", store=target.describe(), schema_version=version)

            nc = await connect_nats(settings, name=settings.instance or "hotseat-audit")
            stack.push_async_callback(nc.drain)
            js = nc.jetstream()
            await ensure_audit_stream(js, settings.stream_spec(), update=True)

            consumer = AuditConsumer(
                nc,
                store,
                metrics,
                stream=settings.audit_stream,
                consumer=settings.consumer,
                filter_subject=settings.subjects.audit_all,
                batch_size=settings.batch_size,
                ack_wait=settings.ack_wait,
            )
            await consumer.subscribe()
            retention = RetentionJob(
                store,
                metrics,
                max_age=settings.retention,
                interval=settings.retention_interval,
                batch=settings.retention_batch,
            )
            readiness.add("store_migrated", lambda: True)  # added only once migrated
            readiness.add("consumer", lambda: consumer.subscribed)
            readiness.add("nats", lambda: nc.is_connected)
            consuming = supervisor.spawn(consumer.run(), "audit-consumer")
            retaining = supervisor.spawn(retention.run(), "audit-retention")
            log.info("audit_started", stream=settings.audit_stream, consumer=settings.consumer)
            try:
                yield {"store": store}
            finally:
                readiness.shutting_down = True
                consumer.stop()
                retention.stop()
                finished = await supervisor.wait(consuming, settings.shutdown_grace)
                await supervisor.wait(retaining, settings.shutdown_grace)
                await consumer.close()
                tally = consumer.tally
                log.info(
                    "audit_stopped",
                    stored=tally.stored,
                    duplicates=tally.duplicates,
                    dead_letters=tally.dead_letters,
                    batches=tally.batches,
                    store_errors=tally.store_errors,
                    retention_deleted=retention.deleted,
                    clean=finished and not supervisor.failed,
                )

    app = FastAPI(
        title="Hotseat audit",
        description="Every request outcome and pool transition, stored once and queryable.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    serve_api_docs(app)
    install_error_handlers(app)
    app.include_router(ops_router(readiness, registry))
    app.include_router(build_router(cursor_key(settings)))
    return app, supervisor
