"""A flat prefetch list (``prefetch_node_feats=["feat"]``) on a heterograph means "every type
that has the key" on both sampling paths: the same sampler object, through the task's loader
helpers, gives blocks with the same prefetched keys with ``sampling="cpu"`` (DGL) and
``sampling="device"``."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import mode

from hetero_tasks import make_hetero

CPU = torch.device("cpu")


def _graph():
    g = make_hetero()  # paper: feat, label; word: label only
    g.edges["cites"].data["w"] = torch.rand(g.num_edges("cites"))  # one relation of three has it
    return g


def _placed(loader, sampling):
    assert mode.place(loader, CPU, sampling, announce=False) == sampling
    return next(iter(loader))


def _as_dict(data, key):
    value = data[key]
    return value if isinstance(value, dict) else {}


def _flat_sampler():
    return dgl.dataloading.NeighborSampler([2, 2], prefetch_node_feats=["feat"], prefetch_labels=["label"],
                                           prefetch_edge_feats=["w"])


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_a_flat_prefetch_list_on_a_heterograph_gathers_every_type_having_the_key(sampling):
    g, sampler = _graph(), _flat_sampler()
    task = GraphTask()
    seeds = {"paper": torch.arange(10), "word": torch.arange(6)}
    input_nodes, output_nodes, blocks = _placed(task.node_dataloader(seeds, sampler, 8, graph=g), sampling)
    feat = _as_dict(blocks[0].srcdata, "feat")
    assert list(feat) == ["paper"]  # "word" has no feat: left out, as the device sampler reads it
    assert torch.equal(feat["paper"], g.nodes["paper"].data["feat"][input_nodes["paper"]])
    labels = _as_dict(blocks[-1].dstdata, "label")
    assert sorted(labels) == ["paper", "word"]
    for nt, ids in output_nodes.items():
        assert torch.equal(labels[nt], g.nodes[nt].data["label"][ids])
    cites = ("paper", "cites", "paper")
    for block in blocks:
        w = block.edges[cites].data["w"]
        assert torch.equal(w, g.edges[cites].data["w"][block.edges[cites].data["_ID"]])
    # The user's sampler is left as given (it may serve a homogeneous graph as well).
    assert sampler.prefetch_node_feats == ["feat"] and sampler.prefetch_labels == ["label"]


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_an_edge_loader_takes_a_flat_prefetch_list_on_a_heterograph(sampling):
    g = _graph()
    sampler = dgl.dataloading.NeighborSampler([2], prefetch_node_feats=["feat"], prefetch_edge_feats=["w"])
    loader = GraphTask().edge_dataloader({"cites": torch.arange(12), "has": torch.arange(8)}, sampler, 8,
                                         graph=g)
    input_nodes, pos, neg, blocks = _placed(loader, sampling)
    feat = _as_dict(blocks[0].srcdata, "feat")
    assert list(feat) == ["paper"]
    assert torch.equal(feat["paper"], g.nodes["paper"].data["feat"][input_nodes["paper"]])
    cites = ("paper", "cites", "paper")
    assert torch.equal(blocks[0].edges[cites].data["w"],
                       g.edges[cites].data["w"][blocks[0].edges[cites].data["_ID"]])


def test_the_same_keys_on_both_paths():
    g, sampler = _graph(), _flat_sampler()
    task = GraphTask()
    keys = {}
    for sampling in ("cpu", "device"):
        _, _, blocks = _placed(task.node_dataloader({"paper": torch.arange(10)}, sampler, 8, graph=g), sampling)
        keys[sampling] = (sorted(_as_dict(blocks[0].srcdata, "feat")), sorted(_as_dict(blocks[-1].dstdata, "label")))
    assert keys["cpu"] == keys["device"] == (["paper"], ["paper", "word"])


def test_a_flat_key_no_type_has_is_refused_naming_it_and_each_types_keys():
    g = _graph()
    sampler = dgl.dataloading.NeighborSampler([2], prefetch_node_feats=["x"])
    with pytest.raises(ValueError, match=r"prefetch_node_feats=.*no node type of the graph has \['x'\].*'word': "
                                         r"\['label'\].*\{ntype: \[keys\]\}"):
        GraphTask().node_dataloader({"paper": torch.arange(4)}, sampler, 4, graph=g)
