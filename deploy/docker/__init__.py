"""Helpers the Dockerfile runs while building the image."""
