"""Imported first by the benchmark modules: ``import graphtrainer`` from this checkout
without an install, and DGL on its PyTorch backend.

The scripts put this folder on ``sys.path``; spawned children inherit that path, so the
classes of these modules can be pickled to them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
