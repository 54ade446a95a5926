"""DGL's CPU sampling with several OpenMP threads under ``Trainer(deterministic=True)`` (DGL's
thread fixes switched on): with two, a batch depends on its seed alone (relabelling races no
longer change what is drawn); with more, a rerun of the same script draws the same (threads
started after seeding are seeded, numbered in order) and the loader warns that batches depend
on the process's history. Switched off, the fixes do nothing."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import graphtrainer  # noqa: F401  (before dgl: installs the fixes)
from graphtrainer._compat import dgl_2_1_threads
from graphtrainer.data import workers
from graphtrainer.data.determinism import deterministic
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.launch.threads import set_threads

from hetero_tasks import make_hetero
from tasks import make_graph

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def threads(request):
    """Sampling (DGL and torch) with ``request.param`` threads and the fixes on, restored afterwards."""
    before = torch.get_num_threads()
    set_threads(request.param)
    with deterministic(True):
        yield request.param
    set_threads(before)


def _tensors(x):
    return [x[k] for k in sorted(x)] if isinstance(x, dict) else [x]


def _block_tensors(block):
    import dgl

    return _tensors(block.srcdata[dgl.NID]) + [t for et in block.canonical_etypes for t in block.edges(etype=et)]


def _node_batches(loader):
    loader.set_epoch(0)
    out = []
    for inputs, outputs, blocks in loader:
        out.extend(_tensors(inputs))
        out.extend(t for b in blocks for t in _block_tensors(b))
    return out


def _edge_batches(loader):
    loader.set_epoch(0)
    out = []
    for inputs, pos, neg, blocks in loader:
        out.extend([inputs, *pos.edges(), *neg.edges()])
        out.extend(t for b in blocks for t in _block_tensors(b))
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("threads", [2], indirect=True)
@pytest.mark.parametrize("fused", [True, False])
def test_node_batches_repeat_with_several_threads(threads, fused):
    import dgl

    g = make_graph(num_nodes=3000, avg_degree=12)
    sampler = dgl.dataloading.NeighborSampler([6, 6], fused=fused)
    loader = NodeLoader(g, torch.arange(3000), sampler, 300, seed=7)
    _assert_same(_node_batches(loader), _node_batches(loader))


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_fused_and_unfused_agree_with_several_threads(threads):
    """Both number a block's new source nodes as one thread would."""
    import dgl

    g = make_graph(num_nodes=3000, avg_degree=12)
    batches = [_node_batches(NodeLoader(g, torch.arange(3000), dgl.dataloading.NeighborSampler([6, 6], fused=f),
                                        300, seed=7)) for f in (True, False)]
    _assert_same(*batches)


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_hetero_node_batches_repeat_with_several_threads(threads):
    import dgl

    g = make_hetero(num_papers=1500, num_words=800)
    ids = {"paper": torch.arange(1500)}
    loader = NodeLoader(g, ids, dgl.dataloading.NeighborSampler([5, 5]), 200, seed=3)
    first = _node_batches(loader)
    _assert_same(first, _node_batches(loader))


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_edge_batches_with_negatives_repeat_with_several_threads(threads):
    g = make_graph(num_nodes=3000, avg_degree=12)
    loader = EdgeLoader(g, torch.arange(g.num_edges())[:3000], [5, 5], 300, negatives=2, seed=2)
    first = _edge_batches(loader)
    _assert_same(first, _edge_batches(loader))


_RERUN = """
import sys, warnings
import graphtrainer, dgl, torch
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.launch.threads import set_threads
from tasks import make_graph
from graphtrainer.data.determinism import apply_mode
threads = int(sys.argv[1])
set_threads(threads)
apply_mode(True)
g = make_graph(num_nodes=3000, avg_degree=12)
if sys.argv[2] == "loader":
    loader = NodeLoader(g, torch.arange(3000), dgl.dataloading.NeighborSampler([6, 6]), 300, seed=7)
    loader.set_epoch(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        total = sum(int((b[2][0].srcdata[dgl.NID] * 7919).sum() + b[2][0].edges()[0].sum()) for b in loader)
    print(total, [str(w.message)[:110] for w in seen])
else:  # one layer after a smaller team ended threads 2 and up
    dgl.seed(5)
    torch.set_num_threads(2)
    torch.rand(200_000).sum()
    torch.set_num_threads(threads)
    s, d = g.sample_neighbors(torch.arange(3000), 4).edges()
    print(int((s * 7919 + d).sum()))
"""


def _reruns(*args, times=3):
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'helpers'}", "DGLBACKEND": "pytorch"}
    return {subprocess.run([sys.executable, "-c", _RERUN, *map(str, args)], env=env, capture_output=True, text=True,
                           timeout=100, check=True).stdout for _ in range(times)}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [3, 4])
def test_threads_started_after_seeding_draw_alike_in_every_rerun(threads):
    """A smaller OpenMP team ends the surplus threads and the next full team starts new ones,
    which DGL leaves seeded by the OS and numbered first come first served."""
    runs = _reruns(threads, "layer")
    assert len(runs) == 1, runs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_batches_with_more_threads_repeat_in_reruns_and_the_loader_warns():
    """Not with two threads, nor where worker processes sample (with one thread each)."""
    import dgl

    runs = _reruns(3, "loader")
    assert len(runs) == 1, runs
    said = runs.pop()
    assert "on the CPU with 3 threads. Under Trainer(deterministic=True) a rerun" in said
    g = make_graph(num_nodes=300)
    before = torch.get_num_threads()
    try:
        with deterministic(True):
            for threads, num_workers in ((2, 0), (3, 1)):
                set_threads(threads)
                loader = NodeLoader(g, torch.arange(300), dgl.dataloading.NeighborSampler([2]), 100, seed=1,
                                    num_workers=num_workers)
                loader.set_epoch(0)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    list(loader)
    finally:
        set_threads(before)
        workers._warned_threads.clear()


@pytest.mark.parametrize("fused", [True, False])
def test_switched_off_the_fixes_pass_dgls_calls_through(monkeypatch, fused):
    """Trainer(deterministic=False), the default: no renumbering, no reseeding."""
    import dgl

    def never(*args, **kwargs):
        raise AssertionError("a fix ran while switched off")

    monkeypatch.setattr(dgl_2_1_threads, "canonical_block", never)
    monkeypatch.setattr(dgl_2_1_threads, "seed_team", never)
    before = torch.get_num_threads()
    set_threads(3)
    try:
        assert not dgl_2_1_threads.thread_fixes_on()
        dgl.seed(4)
        g = make_graph(num_nodes=600, avg_degree=8)
        loader = NodeLoader(g, torch.arange(600), dgl.dataloading.NeighborSampler([4, 4], fused=fused), 100, seed=7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert len(_node_batches(loader)) > 0
    finally:
        set_threads(before)
        workers._warned_threads.clear()


def test_the_mode_is_put_back_after_a_run():
    with deterministic("warn"):
        assert dgl_2_1_threads.thread_fixes_on() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert not dgl_2_1_threads.thread_fixes_on() and not torch.are_deterministic_algorithms_enabled()


_WORKER = """
import graphtrainer, torch
from graphtrainer._compat.dgl_2_1_threads import thread_fixes_on
from graphtrainer.data.workers import _WorkerInit
_WorkerInit(None, "warn")(0)  # what a spawned sampling worker of a deterministic rank runs first
print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
      thread_fixes_on())
"""


@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_a_sampling_worker_takes_its_ranks_mode():
    """A worker started by spawn or forkserver does not inherit torch's setting: it is set again."""
    env = {"PYTHONPATH": str(ROOT), "DGLBACKEND": "pytorch"}
    out = subprocess.run([sys.executable, "-c", _WORKER], env=env, capture_output=True, text=True, timeout=100,
                         check=True).stdout
    assert out.split() == ["True", "True", "True"]
