"""The services' NATS connection keeps no socket of a reconnect attempt that failed."""

from __future__ import annotations

import gc
import warnings

import psutil

from hotseat.launcher import Managed
from hotseat_common.connections import open_nats
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import eventually


def _sockets_to(port: int) -> list[str]:
    """This process's TCP sockets whose peer is ``127.0.0.1:port``, by state."""
    return [
        c.status
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port
    ]


async def test_a_failed_reconnect_attempt_leaves_no_socket_open(nats_server: Managed) -> None:
    """For a while every new connection is closed before NATS's greeting reaches the client
    (a balancer in front of a NATS that is down), so each reconnect attempt fails its
    handshake. Through that outage the client holds one socket at most, and once it is
    connected again there is nothing left for the garbage collector to close: nats-py on
    its own keeps each failed attempt's socket open until then, one per attempt."""
    failures: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        failures.append(exc)

    async def several_attempts_failed() -> bool:
        return len(failures) >= 4

    async def connected() -> bool:
        return client.is_connected

    with FaultProxy(int(nats_server.url.rsplit(":", 1)[1])) as proxy:
        client = await open_nats(
            proxy.url("nats"), reconnect_time_wait=0.05, connect_timeout=2, error_cb=on_error
        )
        try:
            proxy.close_after(0)
            await client.publish("hotseat.test.reconnect", b"")  # its next chunk closes it
            await eventually(several_attempts_failed)
            during = _sockets_to(proxy.port)
            proxy.pass_()
            await eventually(connected)
            after = _sockets_to(proxy.port)
        finally:
            await client.close()
    assert len(during) <= 1, f"sockets of failed attempts still open: {during}"
    assert after == ["ESTABLISHED"], after
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    unclosed = [str(w.message) for w in caught if "StreamWriter" in str(w.message)]
    assert not unclosed, unclosed
