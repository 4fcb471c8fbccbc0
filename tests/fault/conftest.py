"""Fault-test fixtures: a real stack per test whose parts can sit behind fault proxies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hotseat.launcher import Managed
from tests.support.faultproxy import FaultProxy
from tests.support.faultstack import FaultStack
from tests.support.procs import thaw

MakeFaultStack = Callable[..., FaultStack]
StartProxy = Callable[[int], FaultProxy]


@pytest.fixture
def make_stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> Iterator[MakeFaultStack]:
    stacks: list[FaultStack] = []

    def make(config: dict[str, Any], **options: Any) -> FaultStack:
        stack = FaultStack(tmp_path, prefix, nats_server.url, redis_server.url, config, **options)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        for proc in stack.all_procs():
            thaw(proc)  # a test that failed while a process was frozen
        stack.stop()


@pytest.fixture
def proxies() -> Iterator[StartProxy]:
    """Start fault proxies to local ports; all stopped after the test."""
    started: list[FaultProxy] = []

    def start(port: int) -> FaultProxy:
        proxy = FaultProxy(port).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
