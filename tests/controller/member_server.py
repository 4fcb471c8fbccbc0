"""A stand-in for a model server process, run as a command by the process driver's tests.

Like llama.cpp's ``llama-server``: it binds its port at once, answers ``/health`` with
503 while "loading" (``--startup-delay``) and 200 after, and serves llama.cpp-style
``/slots``. Options reproduce what the driver must survive: ``--ignore-sigterm`` (the
server that hangs on SIGTERM with a request in flight), ``--child`` (a worker process in
the same process group; ``--child-ignores-sigterm``: one that outlives its leader),
``--exit-after`` (a server that dies before it is ready).
``PUT /test/busy`` with body ``1`` or ``0`` makes a slot busy or idle; ``PUT /test/sick``
makes ``/health`` answer 500 (a hung server) or recover.
Standard library only, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self, startup_delay: float) -> None:
        self.ready_at = time.monotonic() + startup_delay
        self.busy = False
        self.sick = False
        self.child_pid: int | None = None


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
            sys.stderr.write(f"member_server: {format % args}\n")

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            ready = time.monotonic() >= state.ready_at
            if self.path == "/health":
                if state.sick:
                    self._send(500, {"error": {"code": 500, "message": "sick"}})
                elif ready:
                    self._send(200, {"status": "ok", "child_pid": state.child_pid})
                else:
                    self._send(503, {"error": {"code": 503, "message": "Loading model"}})
            elif self.path == "/slots":
                self._send(
                    200, [{"id": 0, "is_processing": state.busy}, {"id": 1, "is_processing": False}]
                )
            else:
                self._send(404, {"error": "not found"})

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.path == "/test/busy":
                state.busy = body.strip() == b"1"
                self._send(200, {"busy": state.busy})
            elif self.path == "/test/sick":
                state.sick = body.strip() == b"1"
                self._send(200, {"sick": state.sick})
            else:
                self._send(404, {"error": "not found"})

    return Handler


def ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--child-ignores-sigterm", action="store_true")
    parser.add_argument("--exit-after", type=float, default=None)
    args = parser.parse_args()

    if args.ignore_sigterm:
        # Inherited by the child too, as an ignored disposition survives exec.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    state = State(args.startup_delay)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    print(f"member_server: listening on {args.host}:{args.port}", flush=True)
    if args.child or args.child_ignores_sigterm:
        # The ignored disposition is set before exec, so it holds from the worker's first
        # instruction (no window where a SIGTERM would still kill it).
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"],  # a worker that idles
            preexec_fn=ignore_sigterm if args.child_ignores_sigterm else None,  # noqa: PLW1509
        )
        state.child_pid = child.pid
        print(f"member_server: worker pid {child.pid}", flush=True)
    if args.exit_after is not None:

        def die() -> None:
            time.sleep(args.exit_after)  # the scripted moment the server crashes
            print(
                "member_server: error: failed to load model 'missing.gguf'",
                file=sys.stderr,
                flush=True,
            )
            sys.stderr.flush()
            os._exit(3)

        threading.Thread(target=die, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
