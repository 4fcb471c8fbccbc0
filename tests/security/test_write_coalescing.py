"""What the router writes in one event-loop turn goes out in one system call: a response
whose head and body are both at hand costs the router process one ``write``, not one
for the head and one for the body (counted by the kernel: ``syscw`` of
``/proc/<pid>/io``), and every response still arrives whole and in order."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.security.conftest import CLIENT_KEY, SecureRouter

REQUESTS = 40
SLACK = 5
"""Writes the router may make besides its answers meanwhile (a NATS ping, a log line)."""


def _writes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/<pid>/io")


def _exchange(sock: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` and read its whole response (it has a Content-Length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, "the router closed the connection"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        more = sock.recv(65536)
        assert more, "the router closed the connection mid-body"
        body += more
    assert len(body) == length, "bytes of a later response arrived with this one"
    return head, body


def test_a_response_at_hand_is_one_write(secure_router: SecureRouter) -> None:
    host, port = secure_router.url.removeprefix("http://").split(":")
    request = (
        f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        _, first = _exchange(sock, request)  # the route's first use, off the count
        before = _writes(secure_router.router.pid)
        for _ in range(REQUESTS):
            head, body = _exchange(sock, request)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert body == first
        written = _writes(secure_router.router.pid) - before
    # One write per response; two (head, then body) would be 2 * REQUESTS.
    assert written <= REQUESTS + SLACK, f"{written} writes for {REQUESTS} responses"
