"""Hotseat deploy files and their offline checks (``python -m deploy.check``)."""
