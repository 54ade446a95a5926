"""DGL's CPU sampling with several OpenMP threads in the rank: DGL 2.1's threads number a block's
new nodes in a race, so one seed draws other batches from run to run. The loader says so, naming
the fixes (Trainer(deterministic=True) among them: test_sampling_threads_fixed.py); worker processes
(one thread each) and the device sampler draw alike at any count."""
from __future__ import annotations

import warnings

import pytest
import torch

import graphtrainer  # noqa: F401  (before dgl)
import dgl
from graphtrainer.data import workers
from graphtrainer.data.device.batches import node_maps
from graphtrainer.data.device.graph import device_graph
from graphtrainer.data.device.sampler import DeviceSampler
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.launch.threads import set_threads

from tasks import make_graph


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    workers._warned_threads.clear()
    yield
    set_threads(before)
    workers._warned_threads.clear()


def _run(threads, num_workers=0):
    set_threads(threads)
    g = make_graph(num_nodes=300)
    loader = NodeLoader(g, torch.arange(300), dgl.dataloading.NeighborSampler([2, 2]), 100, seed=1,
                        num_workers=num_workers)
    loader.set_epoch(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [(inputs, blocks[0].srcdata[dgl.NID]) for inputs, _, blocks in loader]
    return batches, [str(w.message) for w in caught if "samples this rank's batches" in str(w.message)]


def test_the_loader_warns_once_where_dgl_samples_with_several_threads(restore_threads):
    _, said = _run(2)
    assert len(said) == 1
    assert "with 2 threads" in said[0] and "threads_per_proc=1" in said[0] and "num_workers=k" in said[0]
    assert "sampling='device'" in said[0] and "Trainer(deterministic=True)" in said[0]
    assert _run(2)[1] == []  # once per process and thread count


@pytest.mark.parametrize("threads, num_workers", [(1, 0), (2, 1)])
def test_no_warning_with_one_thread_or_worker_processes(restore_threads, threads, num_workers):
    batches, said = _run(threads, num_workers)
    assert said == [] and batches


def test_worker_processes_draw_what_one_thread_draws(restore_threads):
    """DGL's workers sample with one thread each: the batches of a 1-thread rank, whatever its count."""
    one, _ = _run(1)
    two_with_workers, _ = _run(2, num_workers=1)
    assert len(one) == len(two_with_workers)
    for (a, sa), (b, sb) in zip(one, two_with_workers):
        assert torch.equal(a, b) and torch.equal(sa, sb)


def test_the_device_sampler_draws_alike_at_any_thread_count(restore_threads):
    """Its draws come from a torch generator: the same with 4 threads as with 1."""
    g = make_graph(num_nodes=3000, avg_degree=12)

    def sample():
        s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([6, 6]), g)
        dg = device_graph(g, torch.device("cpu"), s.node_keys(), s.edge_keys())
        inputs, blocks = s.sample(dg, node_maps(dg), {"_N": torch.arange(0, 3000, 3)},
                                  torch.Generator().manual_seed(4))
        return [inputs["_N"], *(t for b in blocks for t in (b.srcdata["_ID"], *b.edges()))]

    set_threads(4)
    many = sample()
    set_threads(1)
    one = sample()
    assert len(many) == len(one) and all(torch.equal(a, b) for a, b in zip(many, one))
