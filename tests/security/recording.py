"""An upstream that records every request it receives and answers each with one small
chat completion, in a thread of its own (so that a test driving the router with blocking
sockets can use it), and a blocking raw-socket HTTP/1.1 client that reads one answer."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import orjson

from tests.router.upstreams import completion


@dataclass(frozen=True)
class Recorded:
    method: str
    target: str
    """The request target as it arrived (path and query string, not decoded)."""
    headers: list[tuple[str, str]]
    body: bytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answer: ClassVar[bytes] = orjson.dumps(completion("served"))

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        server: RecordingUpstream = self.server  # type: ignore[assignment]
        with server.lock:
            server.requests.append(Recorded("POST", self.path, list(self.headers.items()), body))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        """Quiet: every request is in :attr:`RecordingUpstream.requests`."""


class RecordingUpstream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def since(self, start: int) -> list[Recorded]:
        with self.lock:
            return self.requests[start:]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class Silent(Exception):
    """The connection ended (closed or reset) before a whole answer arrived."""


def exchange(address: tuple[str, int], raw: bytes, *, head_only: bool, timeout: float) -> Answer:
    """Send ``raw`` on a new connection and read the first final answer (skipping 1xx);
    ``head_only`` for the answer to a HEAD request (no body). Raises :class:`Silent`."""
    with socket.create_connection(address, timeout=timeout) as sock:
        # A refused request may be answered and closed while the rest is still being
        # sent; the answer is then still there to read.
        with contextlib.suppress(OSError):
            sock.sendall(raw)
        return _Reader(sock).answer(head_only=head_only)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def _more(self) -> None:
        try:
            data = self._sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Silent(f"reset after {len(self._buffer)} bytes") from exc
        if not data:
            raise Silent(f"closed after {len(self._buffer)} bytes")
        self._buffer += data

    def _until(self, marker: bytes) -> bytes:
        while (at := self._buffer.find(marker)) < 0:
            self._more()
        found, self._buffer = self._buffer[:at], self._buffer[at + len(marker) :]
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._more()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def answer(self, *, head_only: bool) -> Answer:
        while True:
            lines = self._until(b"\r\n\r\n").split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            headers = [
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(b":") for line in lines[1:])
            ]
            if status >= 200:
                break
        found = Answer(status, headers, b"")
        if head_only or status in {204, 304}:
            return found
        if found.header(b"transfer-encoding") == b"chunked":
            chunks = []
            while size := int(self._until(b"\r\n").split(b";")[0], 16):
                chunks.append(self._exactly(size))
                self._exactly(2)
            return Answer(status, headers, b"".join(chunks))
        length = found.header(b"content-length")
        if length is not None:
            return Answer(status, headers, self._exactly(int(length)))
        with contextlib.suppress(Silent):
            while True:
                self._more()
        return Answer(status, headers, self._buffer)
