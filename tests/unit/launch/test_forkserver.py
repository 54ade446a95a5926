"""launcher="forkserver": a clean server per fit, stopped when the fit ends quietly; ranks with
several threads after the launching process used OpenMP (where a plain fork would need
its fresh-thread work-around) train without hanging."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.launch import forkserver

from conftest import rank_children
from tasks import RegressionTask, SageTask, make_graph


class ServerPid(RegressionTask):
    """Rank 0 logs the pid of its parent: the fork server."""

    def __init__(self) -> None:
        super().__init__(validate=False, scheduler=None)

    def on_train_epoch_end(self) -> None:
        import os

        self.log("parent_pid", float(os.getppid()) if self.rank == 0 else 0.0, reduce_fx="sum")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_each_fit_gets_its_own_server_and_none_is_left(root_dir, capfd):
    seen = []
    for _ in range(2):
        trainer = Trainer(num_procs=2, launcher="forkserver", max_epochs=1, progress_bar=False,
                          default_root_dir=root_dir, logger=False)
        trainer.fit(ServerPid())
        assert forkserver.server_pid() is None and not rank_children()
        seen.append(int(trainer.history[-1]["parent_pid"]))
    import os

    assert os.getpid() not in seen  # ranks are children of the server, not of this process
    assert seen[0] != seen[1]  # a fresh server each time
    # The server froze its imports for the collector; it unfreezes them as it exits, else a nanobind
    # extension (triton's, imported by torch 2.15) reports every frozen object as leaked.
    err = capfd.readouterr().err
    assert "leaked" not in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_with_two_threads_after_openmp_use_here(root_dir):
    graph = make_graph(num_nodes=2000)
    torch.randn(1000, 1000) @ torch.randn(1000, 1000)  # this process has used OpenMP
    trainer = Trainer(num_procs=2, launcher="forkserver", threads_per_proc=2, max_epochs=2, progress_bar=False,
                      default_root_dir=root_dir, logger=False, hang_timeout=60)
    trainer.fit(SageTask(graph, batch_size=64))
    assert trainer.global_step == 2 * 10  # 1200 training ids, 600 per rank, batches of 64
    assert not rank_children() and forkserver.server_pid() is None
