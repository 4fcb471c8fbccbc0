"""Pure pool decisions (PRODUCT.md section 2): a snapshot of one pool in, a decision out,
no I/O. One module per concern: :mod:`.model` (what they read and return), :mod:`.busy`
(whether the incumbent serves), :mod:`.start` (starting a swap), :mod:`.hold` (holding a
request), :mod:`.acquire`, :mod:`.tick` (the supervisor, takeover), :mod:`.swap` (the swap
owner's steps), :mod:`.recovery` (a lost resident, a lost store) and :mod:`.admin`."""
