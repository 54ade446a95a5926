"""Device-sampled blocks read graph data the sampler did not gather, as DGL's CPU blocks do:
``blocks[0].srcdata["x"]`` on a graph whose features are ``x``, ``blocks[-1].dstdata["year"]``,
``blocks[i].edata["w"]``, per type on heterographs, equal to DGL's blocks' values for the same
seeds; one warning per key; a key the graph lacks names what there is. On the CPU here; on a GPU
tests/integration/test_gpu.py runs this file again with ``GRAPHTRAINER_SAMPLER_DEVICE=cuda``."""
from __future__ import annotations

import copy
import os
import pickle
import warnings

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import host_reads, mode

from hetero_tasks import make_hetero

DEV = torch.device(os.environ.get("GRAPHTRAINER_SAMPLER_DEVICE", "cpu"))
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    host_reads.WARNED.clear()  # once per key per process: each test starts with none shown
    yield
    host_reads.WARNED.clear()


def _graph(n: int = 60, feat_dim: int = 3) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(0)
    g = dgl.graph((torch.randint(0, n, (400,), generator=gen), torch.randint(0, n, (400,), generator=gen)),
                  num_nodes=n)
    g.ndata["x"] = torch.randn(n, feat_dim, generator=gen)  # not "feat": a list of fanouts gathers nothing
    g.ndata["label"] = torch.arange(n) % 3
    g.ndata["train_mask"] = torch.rand(n, generator=gen) > 0.5
    g.ndata["year"] = torch.arange(n) + 1990
    g.edata["w"] = torch.rand(g.num_edges(), generator=gen)
    return g


def _hetero() -> dgl.DGLGraph:
    g = make_hetero()  # paper: feat, label; word: label
    g.nodes["paper"].data["year"] = torch.arange(g.num_nodes("paper")) + 1990
    g.edges["cites"].data["w"] = torch.rand(g.num_edges("cites"))
    return g


def _batches(loader, sampling, device=None):
    assert mode.place(loader, device or (DEV if sampling == "device" else CPU), sampling, announce=False) == sampling
    return list(loader)


def _by_id(value, ids):
    """Rows in ascending graph id: DGL's and the device sampler's blocks number the same nodes apart."""
    return value.cpu()[torch.argsort(ids.cpu())]


def _same(dev_view, cpu_view, key, dev_ids, cpu_ids):
    got, want = dev_view[key], cpu_view[key]
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (key, sorted(got), sorted(want))
        for t in want:
            assert torch.equal(_by_id(got[t], dev_ids[t]), _by_id(want[t], cpu_ids[t])), (key, t)
    else:
        assert torch.equal(_by_id(got, dev_ids), _by_id(want, cpu_ids)), key


def test_a_homogeneous_block_reads_any_graph_key_with_dgls_values():
    g = _graph()
    loaders = [GraphTask().node_dataloader(torch.arange(12), [-1, -1], 6, graph=g, shuffle=False) for _ in range(2)]
    cpu, dev = _batches(loaders[0], "cpu"), _batches(loaders[1], "device")
    with pytest.warns(host_reads.HostReadWarning) as shown:
        for (_, _, want), (_, _, got) in zip(cpu, dev):  # every batch, every block, as DGL's
            for b_got, b_want in zip(got, want):
                assert "x" in b_got.srcdata and "nope" not in b_got.srcdata
                for key in ("x", "train_mask", "year"):
                    _same(b_got.srcdata, b_want.srcdata, key, b_got.srcdata["_ID"], b_want.srcdata["_ID"])
                    _same(b_got.dstdata, b_want.dstdata, key, b_got.dstdata["_ID"], b_want.dstdata["_ID"])
                _same(b_got.edata, b_want.edata, "w", b_got.edata["_ID"], b_want.edata["_ID"])
                assert b_got.srcdata["x"].device.type == DEV.type
    # One warning per key in the process, naming the key and the prefetch argument that gathers it.
    messages = [str(w.message) for w in shown if issubclass(w.category, host_reads.HostReadWarning)]
    assert len(messages) == 4, messages
    assert any("srcdata['x']" in m and "prefetch_node_feats=['x']" in m and "feat_key='x'" in m for m in messages)
    assert any("edata['w']" in m and "prefetch_edge_feats=['w']" in m for m in messages)


def test_a_heterograph_block_reads_each_type_that_has_the_key_as_dgl():
    g = _hetero()
    # Labels gathered for papers only: the words' labels are read on access, as DGL's blocks give them.
    sampler = dgl.dataloading.NeighborSampler([-1, -1], prefetch_node_feats={"paper": ["feat"]},
                                              prefetch_labels={"paper": ["label"]})
    seeds = {"paper": torch.arange(10), "word": torch.arange(6)}
    loaders = [GraphTask().node_dataloader(seeds, sampler, 8, graph=g, shuffle=False) for _ in range(2)]
    cpu, dev = _batches(loaders[0], "cpu"), _batches(loaders[1], "device")
    cites = ("paper", "cites", "paper")
    with pytest.warns(host_reads.HostReadWarning):
        for (_, _, want), (_, _, got) in zip(cpu, dev):
            last_got, last_want = got[-1], want[-1]
            _same(last_got.dstdata, last_want.dstdata, "label", last_got.dstdata["_ID"], last_want.dstdata["_ID"])
            assert sorted(last_got.dstdata["label"]) == ["paper", "word"]
            for b_got, b_want in zip(got, want):
                for key in ("year", "label"):
                    _same(b_got.srcdata, b_want.srcdata, key, b_got.srcdata["_ID"], b_want.srcdata["_ID"])
                w_got, w_want = b_got.edges[cites].data, b_want.edges[cites].data
                _same(w_got, w_want, "w", w_got["_ID"], w_want["_ID"])
                assert "year" in b_got.srcnodes["paper"].data and "year" not in b_got.srcnodes["word"].data


def test_a_key_the_graph_lacks_raises_naming_the_keys_there_are():
    g, h = _graph(), _hetero()
    _, _, blocks = _batches(GraphTask().node_dataloader(torch.arange(8), [2], 8, graph=g), "device")[0]
    with pytest.raises(KeyError, match=r"srcdata\['nope'\]: neither the block nor the graph .*the graph has "
                                       r"\['label', 'train_mask', 'x', 'year'\]"):
        blocks[0].srcdata["nope"]
    assert blocks[0].srcdata.get("nope") is None and "nope" not in blocks[0].srcdata
    _, _, blocks = _batches(GraphTask().node_dataloader({"paper": torch.arange(8)}, [2], 8, graph=h), "device")[0]
    assert blocks[0].srcdata["nope"] == {}  # several types: DGL's empty dict (tests/unit/data/test_device_views.py)
    held = r"the block holds \{'paper': \['feat'\]\}"
    with pytest.raises(KeyError, match=rf"srcdata\['nope'\].*{held}; the graph has \{{'paper': \['feat', 'label', "
                                       r".*'year'\]\}"):
        blocks[0].srcnodes["paper"].data["nope"]
    with pytest.raises(KeyError, match=r"srcdata\['year'\].*'word': \['label'\]"):
        blocks[0].srcnodes["word"].data["year"]
    assert "year" not in dict.keys(blocks[0].src_store)  # a read of one type reads that type only


def test_membership_reads_nothing_and_a_deleted_key_is_gone_as_in_dgl():
    g = _graph()
    _, _, blocks = _batches(GraphTask().node_dataloader(torch.arange(8), [2], 8, graph=g), "device")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no read, no warning
        assert "year" in blocks[0].srcdata and "year" in list(blocks[0].srcdata)  # listed as DGL's
        assert list(dict.keys(blocks[0].srcdata)) == ["_ID"]  # and not read
    with pytest.warns(host_reads.HostReadWarning):
        blocks[0].srcdata["year"]
    del blocks[0].srcdata["year"]
    assert "year" not in blocks[0].srcdata
    with pytest.raises(KeyError):
        blocks[0].srcdata["year"]


def test_reads_survive_moves_copies_scopes_and_share_one_reference_to_the_graph():
    g = _graph(feat_dim=2000)  # 480 KB of features: a pickled block must not carry them
    loader = GraphTask().node_dataloader(torch.arange(12), [2, 2], 6, graph=g)
    batches = _batches(loader, "device")
    source = loader.device_sampling.source
    assert source.graph is g  # the graph itself, no copy
    assert all(data.source is source for _, _, blocks in batches for b in blocks
               for data in (b.srcdata, b.dstdata, b.edata))
    block = batches[0][2][0]
    with pytest.warns(host_reads.HostReadWarning):
        mask = block.srcdata["train_mask"]
    for other in (block.to(CPU), copy.deepcopy(block), copy.copy(block)):
        assert torch.equal(other.srcdata["train_mask"].cpu(), mask.cpu())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", host_reads.HostReadWarning)
            assert torch.equal(other.srcdata["year"].cpu(), g.ndata["year"][other.srcdata["_ID"].cpu().long()])
        assert other.srcdata.source is source
    blob = pickle.dumps(block)
    assert len(blob) < g.ndata["x"].nbytes // 4  # without the graph
    back = pickle.loads(blob)
    assert torch.equal(back.srcdata["train_mask"].cpu(), mask.cpu())  # what it held
    with pytest.raises(KeyError, match="pickled"):
        back.srcdata["x"]
    fresh = batches[1][2][0]
    with fresh.local_scope():
        assert fresh.srcdata["year"].numel() == fresh.num_src_nodes()
    assert "year" not in dict.keys(fresh.srcdata) and "year" in fresh.srcdata  # read again when asked


def test_a_heterograph_moves_pickles_and_scopes_keeping_its_reads():
    g = _hetero()
    _, _, blocks = _batches(GraphTask().node_dataloader({"paper": torch.arange(8)}, [2], 8, graph=g), "device")[0]
    block = blocks[0]
    with pytest.warns(host_reads.HostReadWarning):
        with block.local_scope():
            assert sorted(block.srcdata["label"]) == ["paper", "word"]
    moved = block.to(CPU)
    assert sorted(moved.srcdata["label"]) == ["paper", "word"]
    ids = moved.srcdata["_ID"]
    with pytest.warns(host_reads.HostReadWarning, match=r"srcdata\['year'\].*a flat list means every type"):
        assert torch.equal(moved.srcdata["year"]["paper"], g.nodes["paper"].data["year"][ids["paper"].long()])
    back = pickle.loads(pickle.dumps(moved))
    assert sorted(back.srcdata["label"]) == ["paper", "word"]  # held before pickling
    with pytest.raises(KeyError, match="pickled"):
        back.dstdata["year"]


def test_the_positive_pair_graph_reads_node_data_as_dgls_and_the_negative_does_not():
    g = _graph()
    batches = {}
    for sampling in ("cpu", "device"):
        sampler = dgl.dataloading.NeighborSampler([-1], prefetch_node_feats=["x"])
        loader = GraphTask().edge_dataloader(torch.arange(20), sampler, 10, graph=g, shuffle=False)
        batches[sampling] = _batches(loader, sampling)[0]
    _, pos_want, neg_want, _ = batches["cpu"]
    _, pos_got, neg_got, _ = batches["device"]
    with pytest.warns(host_reads.HostReadWarning, match=r"ndata\['year'\]"):
        _same(pos_got.ndata, pos_want.ndata, "year", pos_got.ndata["_ID"], pos_want.ndata["_ID"])
    assert "year" not in neg_want.ndata and "year" not in neg_got.ndata
    with pytest.raises(KeyError):
        neg_got.ndata["year"]
