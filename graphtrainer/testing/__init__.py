"""Helpers for tests and tutorials, outside the engine."""
