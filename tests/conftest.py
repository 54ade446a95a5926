"""Shared test helpers. Multi-process tests use real processes over gloo on CPU."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil
import pytest

from launch_env import LAUNCH_VARS

os.environ.setdefault("DGLBACKEND", "pytorch")


def own_temp_folders() -> set:
    """The temporary folders this process made for a run (ip_config, servers' logs, stacks):
    ``graphtrainer-<kind>-<this pid>-*``."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"graphtrainer-*-{os.getpid()}-*")}


def rank_children() -> list:
    """Live descendants of this process, except multiprocessing's resource tracker (a
    helper of the parent that lives as long as it does, by design)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part for part in child.cmdline()):
                continue
            out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def root_dir(tmp_path):
    """A fresh ``default_root_dir`` for one test."""
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_external_launch_env(monkeypatch):
    """Tests start from a clean environment: a stray RANK/WORLD_SIZE would turn the
    trainer into an externally launched rank."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
