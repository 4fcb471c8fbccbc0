"""The command line cut off by its reader (`hotseat status --json | head`) ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hotseat.yaml"


def test_a_reader_that_went_away_gets_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write is EPIPE
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from hotseat.cli import entry; entry()",
                "check-config",
                str(EXAMPLE),
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr.decode()
    assert b"Traceback" not in done.stderr, done.stderr.decode()
