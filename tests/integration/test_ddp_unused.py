"""DDP's "did not find any unused parameters" warning under find_unused_parameters=True, and
static_graph where it does not apply: what graphtrainer.ddp explains, on real ranks."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import RankFailedError, Trainer

from conftest import rank_children
from hetero_tasks import HeteroTask, make_hetero

PAPERS = {"paper": torch.arange(64)}  # paper seeds only: some steps leave relation weights unused


@pytest.mark.slow  # two 2-rank fits
@pytest.mark.timeout(180)
def test_warning_appears_though_the_option_is_needed_and_static_graph_is_refused_clearly(root_dir, capfd):
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                      logger=False, find_unused_parameters=True)
    trainer.fit(HeteroTask(make_hetero(), PAPERS, 8))
    # DDP's claim, printed by both ranks, though this model fails without the option
    # (tests/test_hetero.py::test_unused_parameters_need_the_option).
    assert capfd.readouterr().err.count("did not find any unused parameters") == 2
    static = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                     logger=False, ddp_kwargs={"static_graph": True})
    with pytest.raises(RankFailedError, match=r"static_graph.*needs every training step to use the same "
                                              r"parameters.*Trainer\(find_unused_parameters=True\)"):
        static.fit(HeteroTask(make_hetero(), PAPERS, 8))
    assert not rank_children()
