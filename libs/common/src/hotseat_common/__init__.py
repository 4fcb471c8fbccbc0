"""Hotseat's shared contract: the one source of config schema, wire names and messages."""

PROTOCOL_VERSION = 1

__all__ = ["PROTOCOL_VERSION"]
