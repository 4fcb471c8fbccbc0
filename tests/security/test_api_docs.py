"""The controller's and the audit service's ``/docs`` pages need nothing but the service:
every script, style and icon the page loads is served by the service itself (FastAPI's
default page loads them from a CDN, which fails on a machine with no internet access).

Checked twice: the page's text names no other host, and a real browser (headless
Chromium) that may reach nothing but the service renders the API's operations from it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from hotseat.launcher import Managed, free_port, start_service
from tests.console.conftest import Offline, chromium_path
from tests.support.stack import Stack

LOADED = re.compile(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""")
HOST = re.compile(r"(?:[a-z][a-z0-9+.-]*:)?//[^\s\"'<>]+", re.IGNORECASE)
"""A URL with a host (``https://cdn...``, ``//cdn...``), anywhere in the page."""


def _check_page(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as client:
        page = client.get("/docs")
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        loaded = [a or b for a, b in LOADED.findall(page.text)]
        assert loaded, page.text
        assert "//" not in "".join(loaded), f"loads from elsewhere: {loaded}"
        for url in loaded:
            asset = client.get(url)
            assert asset.status_code == 200, url
            assert asset.content, url
        assert any(url.endswith(".js") for url in loaded)
        assert HOST.findall(page.text) == [], "the page names another host"
        assert '"validatorUrl": null' in page.text, "Swagger UI's online validator is on"
        assert client.get("/openapi.json").json()["paths"]


async def _check_in_a_browser(base: str) -> None:
    """Headless Chromium refused everything but ``base``: the page renders the API's
    operations (from the document it fetched), asked for nothing elsewhere, threw nothing."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = await browser.new_page()
            offline = Offline(base.rstrip("/"))
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.route("**/*", offline.route)
            await page.goto(f"{base}/docs")
            await page.wait_for_selector(".opblock", timeout=30_000)
            assert await page.locator(".opblock").count() > 0
            await page.wait_for_load_state("networkidle")
        finally:
            await browser.close()
    assert offline.refused == [], f"the page asked for other hosts: {offline.refused}"
    assert errors == []


@pytest.fixture
def audit_url(tmp_path: Path, prefix: str, nats_server: Managed) -> Iterator[str]:
    dsn = f"sqlite:///{tmp_path / 'audit.db'}"
    args = ["--nats-url", nats_server.url, "--subject-prefix", prefix,
            "--audit-stream", f"AUDIT_{prefix}", "--dsn", dsn]  # fmt: skip
    audit = start_service("audit", "hotseat-audit", args, port=free_port(), log_dir=tmp_path)
    try:
        yield audit.url
    finally:
        audit.stop()


def test_the_controllers_docs_page_loads_only_from_the_controller(admin_stack: Stack) -> None:
    _check_page(admin_stack.controller_url)


def test_the_audit_docs_page_loads_only_from_the_audit_service(audit_url: str) -> None:
    _check_page(audit_url)


async def test_the_controllers_docs_page_works_offline_in_a_browser(admin_stack: Stack) -> None:
    await _check_in_a_browser(admin_stack.controller_url)


async def test_the_audit_docs_page_works_offline_in_a_browser(audit_url: str) -> None:
    await _check_in_a_browser(audit_url)
