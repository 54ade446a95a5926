"""Sampling worker processes (``num_workers``) inside launched ranks: the same batches as
sampling in the rank, ``persistent_workers`` kept across epochs, and no process left
behind when a rank fails or is killed while its workers run."""
from __future__ import annotations

import psutil
import pytest
import torch

from graphtrainer import RankFailedError, Trainer
from graphtrainer.data.node_loader import NodeLoader, default_sampler

from conftest import rank_children
from hetero_tasks import HeteroTask, PidRecorder, make_hetero, worker_pids
from tasks import ParamDump

IDS = {"paper": torch.arange(64), "word": torch.arange(32)}


def _batches(loader, epoch):
    loader.set_epoch(epoch)
    return [(b[1], [blk.edges(etype=et) for blk in b[2] for et in blk.canonical_etypes]) for b in loader]


def _same(a, b):
    assert len(a) == len(b)
    for (out_a, edges_a), (out_b, edges_b) in zip(a, b):
        assert all(torch.equal(out_a[nt], out_b[nt]) for nt in out_a)
        assert all(torch.equal(x, y) for ea, eb in zip(edges_a, edges_b) for x, y in zip(ea, eb))


@pytest.fixture
def one_thread():
    """Sampling with one thread, as in a rank on this machine (threads_per_proc = cores // ranks):
    DGL's multi-threaded sampling is not repeatable, and workers sample with one thread."""
    import dgl

    before = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    yield
    dgl.utils.set_num_threads(before)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers, persistent", [(1, False), (2, True)])
def test_workers_sample_the_same_batches_as_the_rank(one_thread, workers, persistent):
    g = make_hetero()
    plain = NodeLoader(g, IDS, default_sampler(g, [2, 2]), 8, seed=5)
    pooled = NodeLoader(g, IDS, default_sampler(g, [2, 2]), 8, seed=5, num_workers=workers,
                        persistent_workers=persistent)
    for epoch in (0, 1):
        _same(_batches(plain, epoch), _batches(pooled, epoch))
    assert not torch.equal(torch.cat([b[0]["paper"] for b in _batches(plain, 0)]),
                           torch.cat([b[0]["paper"] for b in _batches(plain, 1)]))  # epochs differ


def test_bad_worker_options():
    g = make_hetero()
    with pytest.raises(ValueError, match="persistent_workers=True needs num_workers > 0"):
        NodeLoader(g, IDS, default_sampler(g, [2]), 8, persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers=-1"):
        NodeLoader(g, IDS, default_sampler(g, [2]), 8, num_workers=-1)
    with pytest.raises(ValueError, match="use_ddp: set by graphtrainer"):
        NodeLoader(g, IDS, default_sampler(g, [2]), 8, use_ddp=True)


def _fit(root_dir, out, launcher, **loader_kwargs):
    out.mkdir()
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=2, seed=4, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ParamDump(str(out))], logger=False,
                      find_unused_parameters=True)
    trainer.fit(HeteroTask(make_hetero(), IDS, 6, fanouts=(2, 2), loader_kwargs=loader_kwargs))
    assert not rank_children()
    return {r: torch.load(out / f"e1_r{r}.pt", weights_only=True) for r in (0, 1)}, trainer


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_zero_and_one_worker_train_alike_in_ranks(root_dir, tmp_path, launcher):
    plain, t0 = _fit(root_dir, tmp_path / "w0", launcher)
    pooled, t1 = _fit(root_dir, tmp_path / "w1", launcher, num_workers=1, persistent_workers=True)
    for r in (0, 1):
        assert max(float((plain[r][k] - pooled[r][k]).abs().max()) for k in plain[r]) == 0.0
    assert t0.callback_metrics["val_acc"] == t1.callback_metrics["val_acc"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_no_process_left_when_a_rank_fails_with_workers(root_dir, tmp_path, how):
    trainer = Trainer(num_procs=2, max_epochs=3, progress_bar=False, default_root_dir=root_dir, logger=False,
                      find_unused_parameters=True)
    task = HeteroTask(make_hetero(), IDS, 6, fanouts=(2, 2), fail=(how, 1, 3),
                      loader_kwargs={"num_workers": 2, "persistent_workers": True,
                                     "worker_init_fn": PidRecorder(str(tmp_path))})
    with pytest.raises(RankFailedError) as info:
        trainer.fit(task)
    assert info.value.rank == 1
    pids = worker_pids(str(tmp_path))
    assert len(pids) >= 4  # two workers per rank did run
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    # Workers die with their rank (SIGKILL from the kernel); wait for that event, not a time.
    _, alive = psutil.wait_procs([p for p in procs if p.status() != psutil.STATUS_ZOMBIE], timeout=10)
    assert not alive, [p.pid for p in alive]
    assert not rank_children()


@pytest.mark.timeout(120)
def test_edge_loader_workers_sample_the_same_batches(one_thread):
    from graphtrainer.data.edge_loader import EdgeLoader

    from tasks import make_graph

    g = make_graph(num_nodes=120)
    eids = torch.arange(g.num_edges())[:96]
    plain = EdgeLoader(g, eids, [2, 2], 16, negatives=2, seed=7)
    pooled = EdgeLoader(g, eids, [2, 2], 16, negatives=2, seed=7, num_workers=2, persistent_workers=True)
    for epoch in (0, 1):
        for loader in (plain, pooled):
            loader.set_epoch(epoch)
        a, b = list(plain), list(pooled)
        assert len(a) == len(b) == 6
        for (in_a, pos_a, neg_a, blocks_a), (in_b, pos_b, neg_b, blocks_b) in zip(a, b):
            assert torch.equal(in_a, in_b)
            assert all(torch.equal(x, y) for x, y in zip(pos_a.edges(), pos_b.edges()))
            # The negatives follow the epoch in the persistent workers too.
            assert all(torch.equal(x, y) for x, y in zip(neg_a.edges(), neg_b.edges()))
            assert all(torch.equal(x, y) for ba, bb in zip(blocks_a, blocks_b) for x, y in zip(ba.edges(), bb.edges()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_workers_are_kept_across_epochs(one_thread, tmp_path, persistent):
    from hetero_tasks import PidRecorder, worker_pids

    g = make_hetero()
    loader = NodeLoader(g, IDS, default_sampler(g, [2]), 16, num_workers=2, persistent_workers=persistent,
                        worker_init_fn=PidRecorder(str(tmp_path)))
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sum(b[1]["paper"].numel() + b[1]["word"].numel() for b in loader) == 96
    # Two workers started once, or two per epoch.
    assert len(worker_pids(str(tmp_path))) == (2 if persistent else 6)
