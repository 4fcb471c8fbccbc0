"""Fixtures for end-to-end activation tests: a real stack per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hotseat.launcher import Managed
from tests.support.stack import Stack


@pytest.fixture
def make_stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> Iterator[Callable[[dict[str, Any]], Stack]]:
    stacks: list[Stack] = []

    def make(config: dict[str, Any]) -> Stack:
        stack = Stack(tmp_path, prefix, nats_server.url, redis_server.url, config)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.stop()
