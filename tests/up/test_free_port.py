"""Ports handed out for servers that bind later are never handed out twice in a row."""

from __future__ import annotations

from hotseat.launcher import free_port


def test_free_port_does_not_hand_out_a_port_twice() -> None:
    """The kernel gives one free port to several binds to port 0 (about half of 20,000
    calls repeated an earlier port when this was checked), so a test's "nothing listens
    here" address could become the next server's; the launcher remembers what it gave."""
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)
