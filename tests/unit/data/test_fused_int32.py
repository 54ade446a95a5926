"""DGL 2.1's fused sampler (what ``NeighborSampler`` runs on the CPU with several threads) on
int32 graphs: its node mapping is made in the graph's id type (graphtrainer._compat.dgl_2_1_fused),
so every block holds real edges of the graph between its own nodes, as on an int64 graph."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graphtrainer  # noqa: F401  (before dgl)
import dgl
from graphtrainer.launch.threads import set_threads

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
ROOT = HELPERS.parents[1]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    set_threads(2)  # DGL takes the fused path only with more than one thread
    yield
    set_threads(before)


def _assert_blocks_are_the_graphs(g, blocks, seeds):
    assert torch.equal(blocks[-1].dstdata[dgl.NID], seeds)
    for block in blocks:
        u, v = block.edges()
        assert int(u.max()) < block.num_src_nodes()  # DGL's int32 blocks pointed past their nodes
        src_ids, dst_ids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
        assert torch.equal(src_ids[:block.num_dst_nodes()], dst_ids)
        assert len(torch.unique(src_ids)) == len(src_ids)
        real = g.find_edges(block.edata[dgl.EID])
        assert torch.equal(src_ids[u.long()], real[0]) and torch.equal(dst_ids[v.long()], real[1])


@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
def test_fused_blocks_on_an_int32_graph_hold_the_graphs_edges(two_threads, idtype):
    g = dgl.rand_graph(20000, 200000).astype(idtype)
    sampler = dgl.dataloading.NeighborSampler([10, 10])
    assert sampler.fused
    dgl.seed(1)
    for i in range(5):
        seeds = torch.randperm(20000, generator=torch.Generator().manual_seed(i))[:256].to(idtype)
        _, _, blocks = sampler.sample(g, seeds)
        _assert_blocks_are_the_graphs(g, blocks, seeds)


def test_fused_blocks_of_an_int32_heterograph_hold_the_graphs_edges(two_threads):
    gen = torch.Generator().manual_seed(0)
    g = dgl.heterograph({("user", "follows", "user"): (torch.randint(0, 3000, (30000,), generator=gen),
                                                       torch.randint(0, 3000, (30000,), generator=gen)),
                         ("item", "bought_by", "user"): (torch.randint(0, 2000, (20000,), generator=gen),
                                                         torch.randint(0, 3000, (20000,), generator=gen))},
                        num_nodes_dict={"user": 3000, "item": 2000}, idtype=torch.int32)
    sampler = dgl.dataloading.NeighborSampler([5, 5])
    for i in range(3):
        seeds = {"user": torch.randperm(3000, generator=gen)[:128].int()}
        _, _, blocks = sampler.sample(g, seeds)
        assert torch.equal(blocks[-1].dstnodes["user"].data[dgl.NID], seeds["user"])
        for block in blocks:
            for etype in block.canonical_etypes:
                u, _ = block.edges(etype=etype)
                assert u.numel() == 0 or int(u.max()) < block.num_src_nodes(etype[0])
                real = g.find_edges(block.edges[etype].data[dgl.EID], etype=etype)
                assert torch.equal(block.srcnodes[etype[0]].data[dgl.NID][u.long()], real[0])


@pytest.mark.timeout(120)
@pytest.mark.slow  # 3 s or more on 2 cores: a 2-rank fit
def test_a_two_thread_fit_on_an_int32_graph_trains(tmp_path):
    """Before the fix this fit read out of bounds (glibc: "malloc(): unaligned tcache chunk
    detected", or garbage); in a child process, so a crash fails the test, not the suite."""
    script = ("import graphtrainer, math\nfrom graphtrainer import Trainer\nfrom tasks import SageTask, make_graph\n"
              "g = make_graph(num_nodes=5000, avg_degree=10).int()\n"
              f"t = Trainer(threads_per_proc=2, max_epochs=2, seed=3, progress_bar=False, logger=False, "
              f"enable_model_summary=False, default_root_dir={str(tmp_path)!r})\n"
              "t.fit(SageTask(g, fanouts=(6, 6), batch_size=64))\n"
              "assert all(math.isfinite(r['train_loss']) for r in t.history), t.history\n"
              "assert t.history[-1]['val_acc'] > 0.8, t.history\nprint('trained', t.history[-1])\n")
    env = dict(os.environ, DGLBACKEND="pytorch",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HELPERS), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0 and "trained" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
