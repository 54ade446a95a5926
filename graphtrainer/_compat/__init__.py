"""Workarounds for the DGL and torch versions graphtrainer supports, one module per target.

:mod:`graphtrainer` imports this package before anything else, so every graphtrainer module
that imports DGL does so after the workarounds are in place.
"""
from .dgl_2_1 import graphbolt_available, install

__all__ = ["graphbolt_available", "install"]
