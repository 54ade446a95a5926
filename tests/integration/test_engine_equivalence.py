"""Equivalence: 2 ranks with batch b train exactly like 1 rank with batch 2b.

Why it must hold: each epoch's permutation of the ids comes from ``(seed, epoch)`` alone,
and rank r takes its positions r, r + 2, r + 4, ... So step k of the 2-rank run covers
positions [2bk, 2b(k+1)) of the permutation, b on each rank, which is step k of the
1-rank run with batch 2b. With a full-neighbour sampler a seed's output does not depend
on the other seeds of its batch; each rank's loss is a mean over its b seeds and DDP
averages the two gradients, so the step is the gradient of the mean over all 2b seeds.
Plain SGD adds no state. 96 training ids: 6 steps of 16 per epoch, no padding.
"""
from __future__ import annotations

import pytest
import torch

from graphtrainer import Trainer

from conftest import rank_children
from tasks import FullSageTask, ParamDump, make_graph

# Three 2-rank fits against a 1-rank reference, spawn included: ~10 s each.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

EPOCHS = 3
B = 8


def _fit(root_dir, out, num_procs, batch_size, launcher="fork", model_seed=None):
    out.mkdir()
    graph = make_graph(num_nodes=160)
    trainer = Trainer(num_procs=num_procs, launcher=launcher, max_epochs=EPOCHS, seed=3, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ParamDump(str(out))], logger=False)
    task = FullSageTask(graph, batch_size=batch_size, model_seed=model_seed)
    trainer.fit(task)
    assert not rank_children()
    assert trainer.global_step == EPOCHS * 96 // (batch_size * num_procs)
    return task


def _load(out, tag, rank):
    return torch.load(out / f"{tag}_r{rank}.pt", weights_only=True)


def _max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The 1-rank references (in this process): batch 2b, and batch b as a control."""
    base = tmp_path_factory.mktemp("one_rank")
    _fit(base / "runs", base / "2b", 1, 2 * B)
    _fit(base / "runs", base / "b", 1, B)
    return base


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher, model_seed",
                         [("fork", None), ("spawn", None), ("spawn", 3), ("forkserver", None), ("forkserver", 3)],
                         ids=["fork", "spawn", "spawn-model-from-parent", "forkserver",
                              "forkserver-model-from-parent"])
def test_two_ranks_batch_b_equal_one_rank_batch_2b(one_rank, root_dir, tmp_path, launcher, model_seed):
    # model_seed: the model is built in the parent with the seed the ranks would use; spawn
    # sends its parameters through shared memory, and each rank must still own a copy.
    out = tmp_path / "two"
    task = _fit(root_dir, out, 2, B, launcher, model_seed)
    assert _max_diff(_load(out, "start", 0), _load(one_rank / "2b", "start", 0)) == 0.0
    for epoch in range(EPOCHS):
        r0, r1 = _load(out, f"e{epoch}", 0), _load(out, f"e{epoch}", 1)
        for name in r0:  # DDP keeps the ranks bit-identical
            assert torch.equal(r0[name], r1[name]), (epoch, name)
        single = _load(one_rank / "2b", f"e{epoch}", 0)
        for name in r0:
            torch.testing.assert_close(r0[name], single[name], atol=1e-5, rtol=0, msg=f"{epoch} {name}")
    final = _load(out, f"e{EPOCHS - 1}", 0)
    # Training moved the weights, by far more than the tolerance, and batch b on one rank
    # (twice the steps) ends elsewhere: the comparison above can tell runs apart.
    assert _max_diff(final, _load(out, "start", 0)) > 1e-2
    assert _max_diff(final, _load(one_rank / "b", f"e{EPOCHS - 1}", 0)) > 1e-3
    # Rank 0's trained weights came back into the caller's task.
    for name, value in task.module.state_dict().items():
        assert torch.equal(value, final[name]), name
