"""One pool as this controller replica runs it, a job per module: :mod:`.answers` (the
requests routers and operators send), :mod:`.pool` (the supervisor and the assembly),
:mod:`.recovery` (health checks, rebuilding a lost state), :mod:`.swaps` (running swaps
as their owner), :mod:`.transitions` (deciding and applying), :mod:`.outcomes` (telling
the world what a transition did), :mod:`.announcer` and :mod:`.counting` (NATS, audit
and metrics)."""
