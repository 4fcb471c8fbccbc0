"""The controller's and the audit service's ``/docs`` pages need nothing but the service:
every script, style and icon the page loads is served by the service itself (FastAPI's
default page loads them from a CDN, which fails on a machine with no internet access)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from hotseat.launcher import Managed, free_port, start_service
from tests.support.stack import Stack

LOADED = re.compile(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""")


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
        assert client.get("/openapi.json").json()["paths"]


def test_the_controllers_docs_page_loads_only_from_the_controller(admin_stack: Stack) -> None:
    _check_page(admin_stack.controller_url)


def test_the_audit_docs_page_loads_only_from_the_audit_service(
    tmp_path: Path, prefix: str, nats_server: Managed
) -> None:
    dsn = f"sqlite:///{tmp_path / 'audit.db'}"
    args = ["--nats-url", nats_server.url, "--subject-prefix", prefix,
            "--audit-stream", f"AUDIT_{prefix}", "--dsn", dsn]  # fmt: skip
    audit = start_service("audit", "hotseat-audit", args, port=free_port(), log_dir=tmp_path)
    try:
        _check_page(audit.url)
    finally:
        audit.stop()
