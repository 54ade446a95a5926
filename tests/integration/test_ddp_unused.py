"""DDP's "did not find any unused parameters" warning under find_unused_parameters=True, and
static_graph where it does not apply: what graphtrainer.loop.ddp explains, on real ranks."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import RankFailedError, Trainer

from conftest import rank_children
from hetero_tasks import HeteroTask, make_hetero

PAPERS = {"paper": torch.arange(64)}  # paper seeds only: some steps leave relation weights unused


@pytest.mark.slow  # a 2-rank fit
@pytest.mark.timeout(180)
def test_static_graph_on_varying_parameters_is_refused_naming_find_unused_parameters(root_dir):
    # Whether DDP also prints "did not find any unused parameters" depends on the model's
    # layers (measured by benchmarks/sparse_embedding.py --ddp-unused), so only the refusal is asserted here.
    static = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                     logger=False, ddp_kwargs={"static_graph": True})
    with pytest.raises(RankFailedError, match=r"static_graph.*needs every training step to use the same "
                                              r"parameters.*Trainer\(find_unused_parameters=True\)"):
        static.fit(HeteroTask(make_hetero(), PAPERS, 8))
    assert not rank_children()
