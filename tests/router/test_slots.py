"""Who gives way when the connection slots are full (hotseat_router.slots), without
sockets: the peer holding the most connections gives its longest-waiting unclaimed one,
unless the newcomer's peer holds as many."""

from __future__ import annotations

from hotseat_router.slots import ConnectionSlots


def filled(**held: int) -> ConnectionSlots[str]:
    """Slots where each peer holds that many unclaimed connections, named peer-n in the
    order they opened."""
    slots: ConnectionSlots[str] = ConnectionSlots()
    for peer, count in held.items():
        for n in range(count):
            slots.opened(peer)
            slots.unclaimed(f"{peer}-{n}", peer)
    return slots


def test_the_peer_holding_most_gives_its_longest_waiting_connection() -> None:
    slots = filled(a=3, b=1)
    slots.opened("c")
    assert slots.give_way("c") == "a-0"
    slots.closed("a-0", "a")
    slots.opened("d")
    assert slots.give_way("d") == "a-1"


def test_a_newcomer_whose_peer_holds_as_many_is_refused() -> None:
    slots = filled(a=2, b=1)
    slots.opened("b")  # b now holds 2, as many as a
    assert slots.give_way("b") is None
    slots.opened("a")
    assert slots.give_way("a") is None


def test_claimed_connections_never_give_way() -> None:
    slots = filled(a=2)
    slots.claimed("a-0", "a")
    slots.claimed("a-1", "a")
    slots.opened("b")
    assert slots.give_way("b") is None
    slots.unclaimed("a-1", "a")  # its response is complete: it waits for the next head
    assert slots.give_way("b") == "a-1"


def test_a_connection_unclaimed_again_waits_from_then() -> None:
    slots = filled(a=3)
    slots.claimed("a-0", "a")
    slots.unclaimed("a-0", "a")
    slots.opened("b")
    assert slots.give_way("b") == "a-1"
    assert slots.open_count("a") == 3
    slots.closed("a-1", "a")
    assert slots.open_count("a") == 2
