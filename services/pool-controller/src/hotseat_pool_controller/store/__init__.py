"""The pool store: pool state in Redis. :mod:`.pool` (the store: reads, applies, reports),
:mod:`.codec` (the layout: typed values to and from the ``state`` hash, every key of a
pool), :mod:`.scripts` (the Lua that runs in Redis), :mod:`.link` (the pipelined
connection) and :mod:`.health` (whether the store answers)."""
