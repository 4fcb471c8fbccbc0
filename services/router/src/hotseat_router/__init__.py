"""Hotseat router: the OpenAI-compatible data plane."""
