"""The web console in a real browser: headless Chromium (Debian's ``chromium``, installed
by scripts/system_deps.sh) driven by Playwright, against a live stack with sim backends,
an audit service and a controller that knows it."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.async_api import Browser, Page, Request, Route, async_playwright

from hotseat.launcher import Managed, free_port, start_service
from tests.support.stack import Stack, pool_stack_config

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """The system Chromium; the tests skip without it (and fail under CI, where
    scripts/system_deps.sh installs it)."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    message = "chromium is not installed (run scripts/system_deps.sh)"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message)
    pytest.skip(message)


StartStack = Callable[[dict[str, Any]], Stack]


@pytest.fixture
def start_console_stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> Iterator[StartStack]:
    """Start a stack for a config: its sims, an audit service, a controller with
    ``HOTSEAT_AUDIT_URL``, a router."""
    started: list[tuple[Stack, list[Managed]]] = []

    def start(config: dict[str, Any]) -> Stack:
        stack = Stack(tmp_path, prefix, nats_server.url, redis_server.url, config)
        extra: list[Managed] = []
        started.append((stack, extra))
        stack.start_sims()
        audit = start_service(
            "audit",
            "hotseat-audit",
            ["--dsn", f"sqlite:///{tmp_path / 'audit.db'}"],
            port=free_port(),
            log_dir=tmp_path,
            env=stack.env,
        )
        extra.append(audit)
        stack.controllers["c1"] = start_service(
            "controller-c1",
            "hotseat-controller",
            ["--instance", "c1"],
            port=free_port(),
            log_dir=tmp_path,
            env={**stack.env, "HOTSEAT_AUDIT_URL": audit.url},
        )
        stack.start_router()
        return stack

    yield start
    for stack, extra in started:
        stack.stop()
        for proc in extra:
            proc.stop(5)


@pytest.fixture
def console_stack(start_console_stack: StartStack) -> Stack:
    """judge (resident by default) and coder (a 3 s load, so a swap is seen running) on
    one sim GPU."""
    return start_console_stack(pool_stack_config(coder={"loadSeconds": 3.0}))


@dataclass
class Offline:
    """Every request the page made that did not go to the stack (each was refused)."""

    origin: str
    refused: list[str] = field(default_factory=list)

    async def route(self, route: Route, request: Request) -> None:
        parts = urlsplit(request.url)
        if f"{parts.scheme}://{parts.netloc}" == self.origin:
            await route.continue_()
        else:
            self.refused.append(request.url)
            await route.abort()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class ConsolePage:
    page: Page
    offline: Offline
    errors: list[str]
    shots: Path

    async def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 0
        return path


async def open_console(
    browser: Browser, url: str, shots: Path, *, width: int = 1200, height: int = 900
) -> ConsolePage:
    """``/ui`` in a fresh page that may reach nothing but ``url`` (every other request is
    refused and recorded)."""
    page = await browser.new_page(viewport={"width": width, "height": height})
    offline = Offline(url.rstrip("/"))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.route("**/*", offline.route)
    await page.goto(f"{url}/ui")
    shots.mkdir(parents=True, exist_ok=True)
    return ConsolePage(page, offline, errors, shots)
