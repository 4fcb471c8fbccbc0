"""Pure pool decisions (PRODUCT.md section 2): a snapshot of one pool in, a decision out
(both in :mod:`hotseat_pool_controller.model`), no I/O. One module per concern:
:mod:`.busy` (whether the incumbent serves), :mod:`.start` (starting a swap), :mod:`.hold`
(holding a request), :mod:`.acquire`, :mod:`.tick` (the supervisor, takeover),
:mod:`.swap` (the swap owner's steps), :mod:`.recovery` (a lost resident, a lost store)
and :mod:`.admin`. A state change is written with the store's codec
(:func:`hotseat_pool_controller.store.codec.set_state`), so no decision spells a field."""
