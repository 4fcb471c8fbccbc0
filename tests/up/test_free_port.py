"""Ports handed out for servers that bind later are never handed out twice in a row, and
processes that pick ports side by side each take them from a range of their own."""

from __future__ import annotations

import itertools
import os

import pytest

from hotseat.launcher import (
    FREE_PORTS_ENV,
    LOWEST_PORT,
    LaunchError,
    ephemeral_ports,
    free_port,
    free_port_range,
)
from tests.support.infra import worker_free_ports

_RUNS = itertools.count()


def test_free_port_does_not_hand_out_a_port_twice() -> None:
    """The kernel gives one free port to several binds to port 0 (about half of 20,000
    calls repeated an earlier port when this was checked), so a test's "nothing listens
    here" address could become the next server's; the launcher remembers what it gave."""
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)


def test_free_ports_come_from_the_range_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HOTSEAT_FREE_PORTS bounds what is handed out, and a range with no port left that
    was not handed out lately is an error, not an endless search."""
    span = free_port_range()
    assert span is not None, "this test needs the kernel's ephemeral range (Linux)"
    # 64 ports of this process's own range that no earlier run of this test handed out
    # (it remembers them): the next window down from the top at each run.
    last = span[1] - 64 * next(_RUNS)
    first = last - 63
    assert first >= span[0], "more runs than windows in this process's range"
    monkeypatch.setenv(FREE_PORTS_ENV, f"{first}-{last}")
    got: list[int] = []
    refused: LaunchError | None = None
    while refused is None and len(got) <= 64:
        try:
            got.append(free_port())
        except LaunchError as exc:
            refused = exc
    assert refused is not None, f"{len(got)} ports handed out of a range of 64"
    assert f"no free port left in {first}-{last}" in str(refused)
    assert got, "not one port was handed out"
    assert all(first <= port <= last for port in got), got
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("text", ["20000", "a-b", "21000-20000", "80-90", "20000-70000", "-"])
def test_a_bad_free_port_range_says_what_is_expected(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(FREE_PORTS_ENV, text)
    with pytest.raises(LaunchError, match=f"{FREE_PORTS_ENV} must be LOW-HIGH") as raised:
        free_port()
    assert repr(text) in str(raised.value)


def test_test_workers_share_the_range_without_overlap() -> None:
    span = (10_000, 32_767)
    slices = [worker_free_ports(f"gw{n}", 4, span).split("-") for n in range(4)]
    bounds = [(int(low), int(high)) for low, high in slices]
    assert bounds[0][0] == span[0]
    assert all(low <= high for low, high in bounds)
    assert all(bounds[n][1] + 1 == bounds[n + 1][0] for n in range(3)), bounds
    assert bounds[-1][1] <= span[1]


def test_this_worker_hands_out_ports_of_its_own_slice() -> None:
    """Under pytest-xdist (as ``make test`` runs the suite) this worker takes its ports from
    its own slice, which the processes its tests start inherit through the environment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("one test process: no slice to keep to")
    span = free_port_range()
    assert span is not None
    assert os.environ[FREE_PORTS_ENV] == f"{span[0]}-{span[1]}"
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    ephemeral = ephemeral_ports()
    assert ephemeral is not None
    whole = ephemeral[0] - LOWEST_PORT
    assert span[1] - span[0] + 1 == whole // workers
    assert all(span[0] <= free_port() <= span[1] for _ in range(200))
