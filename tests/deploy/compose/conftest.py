"""The running compose stack, as ``make compose-test`` describes it in the JSON file that
``HOTSEAT_COMPOSE_TEST_STACK`` names."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
POLL_S = 0.2


@dataclass(frozen=True)
class Stack:
    project: str
    image: str
    compose: list[str]
    gateway: str
    routers: dict[str, str]
    controllers: dict[str, str]
    audit: str
    postgres: str
    nats: str
    redis: str
    config_dir: str
    """Holds the stack's Hotseat config, ``hotseat.yaml``."""

    def compose_run(self, *args: str) -> str:
        """``docker compose`` on this stack's project; its standard output."""
        return subprocess.run(
            [*self.compose, *args], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    def events(self, **filters: str) -> list[dict[str, Any]]:
        """Audit events matching ``filters``, from the audit service's query API."""
        response = httpx.get(f"{self.audit}/v1/events", params=filters, timeout=10)
        response.raise_for_status()
        events: list[dict[str, Any]] = response.json()["events"]
        return events

    def wait_for_events(
        self, done: Callable[[list[dict[str, Any]]], bool], **filters: str
    ) -> list[dict[str, Any]]:
        """The matching events once ``done`` holds for them (the audit trail is written
        after the answer: the router publishes, the audit service consumes)."""
        while not done(events := self.events(**filters)):
            time.sleep(POLL_S)  # the poll interval: the audit API announces no new rows
        return events


@pytest.fixture(scope="session")
def stack() -> Stack:
    path = Path(os.environ["HOTSEAT_COMPOSE_TEST_STACK"])
    return Stack(**json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture
def request_id() -> str:
    return f"compose-test-{uuid.uuid4().hex[:12]}"
