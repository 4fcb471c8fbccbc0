"""``hotseat up``'s stop: a part that ignores SIGTERM is killed at its budget, and named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hotseat.launcher import Managed
from hotseat.up import _stop_tier

# Child programs that only wait to be stopped: their sleep is the whole of their life,
# and what the test waits for is their "ready" line and their exit.
IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(3600)\n"
)
STOPS = "import sys, time\nprint('ready', flush=True)\ntime.sleep(3600)\n"


def _start(name: str, code: str, tmp_path: Path) -> Managed:
    popen = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert popen.stdout is not None
    assert popen.stdout.readline().strip() == b"ready"  # its handler is in place
    popen.stdout.close()
    return Managed(name, popen, "", tmp_path / f"{name}.log")


def test_a_part_that_ignores_sigterm_is_killed_and_named(tmp_path: Path) -> None:
    """Of two parts, the one that stops on SIGTERM is not named; the one that ignores it
    is killed once the tier's budget is over, and is the only one named."""
    stubborn = _start("stubborn", IGNORES_SIGTERM, tmp_path)
    polite = _start("polite", STOPS, tmp_path)
    killed = _stop_tier([stubborn, polite], 0.5)
    assert killed == ["stubborn"]
    assert not stubborn.alive()
    assert not polite.alive()
