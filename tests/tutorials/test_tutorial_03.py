"""Smoke tests of tutorials/03_custom_sampler.py: the sampler in-process on a small graph,
then the script as a user runs it, ``--fast``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tutorial_run
from tutorial_results import check_figures

NAME = "03_custom_sampler.py"


def _module():
    return tutorial_run.load_module(NAME)


@pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
def test_sampler_fanout_without_replacement_and_weights():
    import dgl

    t03 = _module()
    # Node 0 has 12 in-neighbours (1..12); only the 6 even ones carry weight.
    src = torch.arange(1, 13)
    g = dgl.graph((torch.cat([src, torch.zeros(12, dtype=torch.long)]),
                   torch.cat([torch.zeros(12, dtype=torch.long), src])), num_nodes=13)
    g.ndata["feat"] = torch.randn(13, 4)
    g.ndata["label"] = torch.arange(13) % 2
    g.edata["w"] = torch.tensor([1.0 if (s % 2 == 0) else 0.0 for s in range(1, 13)] + [1.0] * 12)
    dgl.seed(0)
    for fanout in (3, 6):
        frontier = t03.WeightedFanoutSampler([fanout]).sample_frontier(0, g, torch.tensor([0]))
        picked, _ = frontier.edges()
        assert picked.numel() == fanout and picked.unique().numel() == fanout     # no repeats
        assert bool((picked % 2 == 0).all())                                      # weight 0: never
    uniform = t03.WeightedFanoutSampler([12], weight=None).sample_frontier(0, g, torch.tensor([0]))
    assert uniform.num_edges() == 12

    # Two layers through DGL's DataLoader: blocks chain, features and labels prefetched.
    sampler = t03.WeightedFanoutSampler([4, 2])
    loader = dgl.dataloading.DataLoader(g, torch.tensor([0, 1, 2]), sampler, batch_size=3)
    input_nodes, output_nodes, blocks = next(iter(loader))
    assert len(blocks) == 2 and torch.equal(output_nodes, torch.tensor([0, 1, 2]))
    assert torch.equal(blocks[1].dstdata[dgl.NID], output_nodes)
    assert torch.equal(blocks[0].dstdata[dgl.NID], blocks[1].srcdata[dgl.NID])
    assert torch.equal(blocks[0].srcdata[dgl.NID], input_nodes)
    assert int(blocks[1].in_degrees().max()) <= 2 and int(blocks[0].in_degrees().max()) <= 4
    assert torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][input_nodes])
    assert torch.equal(blocks[1].dstdata["label"], g.ndata["label"][output_nodes])


@pytest.mark.slow  # several seconds (subprocesses or spawned ranks)
@pytest.mark.timeout(120)
def test_fast_run(tmp_path):
    s = tutorial_run.run_fast(NAME, tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=100)

    assert s["sampler"] == "weighted" and s["num_procs"] == 2 and s["epochs"] == 3
    assert s["num_nodes"] == 20_000 and s["num_edges"] == 200_000
    # 8 balanced classes: chance is 0.125; 3 epochs reach about 0.23.
    assert s["best_val_acc"] > 0.17 and s["test_acc"] > 0.17, s
    assert s["test_nodes"] == 17_000              # every test id scored once over the 2 ranks
    # The figures that tutorials/results/03_custom_sampler.json records, within its tolerances.
    check_figures("03_custom_sampler", s)
    assert Path(s["checkpoint"]).is_file()
    # Only COO before fit; the trainer built CSR and CSC in the parent before forking.
    assert s["formats_before_fit"]["created"] == ["coo"]
    assert sorted(s["formats_after_fit"]["created"]) == ["coo", "csc"]  # what in-edge sampling reads
    # Memory of both ranks and of the launching process came back from the ranks.
    assert set(s["memory_mb"]) == {"rank 0", "rank 1", "launcher"}
    assert all(m["pss"] > 0 and m["uss"] > 0 for m in s["memory_mb"].values())
    # The 1/degree weight pulls the sampled neighbours towards low degrees.
    assert s["sampling"]["weighted_mean_neighbour_degree"] < s["sampling"]["uniform_mean_neighbour_degree"]
