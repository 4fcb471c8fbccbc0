"""Hotseat's operator CLI and the launcher that runs a whole stack on one machine."""
