"""How a request gets an activation lease on a pool member, and gives it back:
:mod:`.protocol` (the client interface and the lease), :mod:`.nats` (the pool
controller over NATS), :mod:`.held` (the leases a router holds: sharing and renewals),
:mod:`.direct` (no controller), :mod:`.scope` (one request's ownership of its lease) and
:mod:`.factory` (which client a router uses)."""
