"""Tracing off (the default): no header, no-op spans, no OpenTelemetry needed; on without
the ``otel`` extra, start-up says what to install."""

from __future__ import annotations

import sys

import pytest

from hotseat_common import tracing
from hotseat_common.tracing import NO_TRACING, TracingUnavailable, start_tracing


def test_without_an_endpoint_tracing_is_off() -> None:
    """No endpoint: the shared no-op tracing, whose spans take attributes and do nothing,
    and which adds no header to any message."""
    off = start_tracing("router", "r1", None)
    assert off is NO_TRACING
    assert not off.enabled
    with off.span(tracing.REQUEST_SPAN, {tracing.POOL: "gpu0"}) as span:
        span.set(tracing.SWAP_ID, "gpu0-1")
    assert off.headers() is None
    assert start_tracing("router", "r1", "") is NO_TRACING


def test_an_endpoint_without_the_extra_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the OpenTelemetry SDK not importable, asking for traces fails with the install
    hint instead of running without them."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(TracingUnavailable, match=r"hotseat-common\[otel\]"):
        start_tracing("router", "r1", "http://127.0.0.1:4318")
