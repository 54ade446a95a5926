"""A lean rank: what ranks would import lazily is imported before they start (the fork
server does it too), and each rank's allocator gives large freed blocks back."""
from __future__ import annotations

import os
import sys
import pytest

from graphtrainer import Trainer
from graphtrainer.launch import forkserver
from graphtrainer.launch.lean import RANK_MODULES, limit_malloc_caches

from conftest import rank_children
from tasks import RegressionTask


class ImportProbe(RegressionTask):
    """Writes, from every rank at setup (before any model, optimizer or DDP exists), which
    of the lazily imported modules the rank already has."""

    def __init__(self, out_dir: str):
        super().__init__(validate=False, scheduler=None)
        self.out_dir = out_dir

    def setup(self, stage: str) -> None:
        have = [name for name in RANK_MODULES if name in sys.modules]
        with open(os.path.join(self.out_dir, f"r{self.rank}.txt"), "w") as fh:
            fh.write(",".join(have))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_forkserver_ranks_start_with_the_lazy_imports_done(root_dir, tmp_path):
    trainer = Trainer(num_procs=2, launcher="forkserver", max_epochs=1, progress_bar=False,
                      default_root_dir=root_dir, logger=False)
    trainer.fit(ImportProbe(str(tmp_path)))
    assert not rank_children() and forkserver.server_pid() is None
    for rank in range(2):
        # Inherited from the server, which imported them once for every rank.
        assert (tmp_path / f"r{rank}.txt").read_text().split(",") == list(RANK_MODULES)


def test_malloc_tuning_applies_on_linux_and_can_be_turned_off(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt: Linux only")
    assert limit_malloc_caches() is True
    monkeypatch.setenv("GRAPHTRAINER_MALLOC_TUNING", "0")
    assert limit_malloc_caches() is False
