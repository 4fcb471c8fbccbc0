"""The budget of request body bytes one router process buffers at once, all requests
together: a body is admitted only while the bytes it needs fit, so memory for bodies is
bounded by the budget however many clients send at once. A declared ``Content-Length``
is claimed whole before a byte is read; a chunked body is claimed as it arrives."""

from __future__ import annotations

from hotseat_router.errors import BodyBudgetExceeded


class BodyBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    def claim(self) -> BodyClaim:
        """An empty claim for one request; release it once the body is no longer held."""
        return BodyClaim(self)


class BodyClaim:
    """One request's share of the budget."""

    __slots__ = ("_budget", "held")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.held = 0

    def cover(self, size: int) -> None:
        """Hold at least ``size`` bytes, or raise :class:`BodyBudgetExceeded` (the claim
        then holds what it held before)."""
        more = size - self.held
        if more <= 0:
            return
        budget = self._budget
        if budget.in_use + more > budget.capacity:
            raise BodyBudgetExceeded(
                "the router is buffering as many request bodies as it may; retry shortly"
            )
        budget.in_use += more
        self.held = size

    def release(self) -> None:
        self._budget.in_use -= self.held
        self.held = 0
