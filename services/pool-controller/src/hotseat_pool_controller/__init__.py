"""Hotseat pool controller: residency, swaps and activation leases (see docs/adr/0001)."""
