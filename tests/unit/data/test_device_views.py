"""Device-sampled blocks' data views behave as DGL 2.1's blocks on the same graph and seeds: a
multi-type view gives ``{}`` for a key no type has and ``{type: tensor}`` of the types that have
it; ``keys()``, iteration, ``len()`` and ``dict(view)`` list every key of the graph (DGL's
subframes), in DGL's order, without reading any; a pickled block lists what it holds."""
from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import host_reads
from graphtrainer.nn import to_torch_graph

from test_device_host_reads import _batches, _by_id, _graph, _hetero

CITES = ("paper", "cites", "paper")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    host_reads.WARNED.clear()
    yield
    host_reads.WARNED.clear()


def _pair(graph, seeds, sampler_args):
    """DGL's first block and the device sampler's, for the same seeds."""
    out = []
    for sampling in ("cpu", "device"):
        sampler = dgl.dataloading.NeighborSampler([-1], **sampler_args)  # every neighbour: the same nodes
        loader = GraphTask().node_dataloader(seeds, sampler, 8, graph=graph, shuffle=False)
        out.append(_batches(loader, sampling)[0][2][0])
    return out


def _views(block):
    """Every data view of a block: the whole-block views, then each type's."""
    out = {"srcdata": block.srcdata, "dstdata": block.dstdata, "edata": block.edata}
    if len(block.canonical_etypes) > 1 or len(block.srctypes) > 1:
        out.update({f"src {nt}": block.srcnodes[nt].data for nt in block.srctypes})
        out.update({f"dst {nt}": block.dstnodes[nt].data for nt in block.dsttypes})
        out.update({f"edges {et}": block.edges[et].data for et in block.canonical_etypes})
    return out


def _same_listing(got, want):
    for name, view in _views(want).items():
        mine = _views(got)[name]
        assert list(mine.keys()) == list(view.keys()), name
        assert list(mine) == list(view) and len(mine) == len(view), name
        assert all(k in mine for k in view), name


def test_a_multi_type_key_no_type_has_is_an_empty_dict_and_some_types_a_dict_of_those_as_dgl():
    want, got = _pair(_hetero(), {"paper": torch.arange(8)}, {"prefetch_node_feats": {"paper": ["feat"]}})
    converted = to_torch_graph(want)  # a DGL block as torch tensors: the same views, nothing read lazily
    with pytest.warns(host_reads.HostReadWarning):
        for block in (got, converted):
            for name in ("srcdata", "dstdata", "edata"):
                assert getattr(want, name)["nope"] == {} and getattr(block, name)["nope"] == {}, name
                assert getattr(block, name).get("nope", 0) == getattr(want, name).get("nope", 0) == {}, name
            for name, key in (("srcdata", "year"), ("dstdata", "year"), ("dstdata", "label"), ("edata", "w")):
                ref, mine = getattr(want, name)[key], getattr(block, name)[key]
                assert isinstance(mine, dict) and list(mine) == list(ref), (name, key)  # those types only
                ids_ref, ids = getattr(want, name)["_ID"], getattr(block, name)["_ID"]
                assert all(torch.equal(_by_id(mine[t], ids[t]), _by_id(ref[t], ids_ref[t])) for t in ref)
            del want.srcdata["nope"]  # DGL: nothing to delete in any type, nothing said
            del block.srcdata["nope"]
    assert "year" in got.srcdata  # still readable: deleting a key no type has deleted nothing


def test_a_homogeneous_block_lists_every_key_of_the_graph_as_dgl_without_reading_them():
    g = _graph()
    for args in ({}, {"prefetch_node_feats": ["label"]}):  # nothing gathered (all keys), one key gathered
        want, got = _pair(g, torch.arange(8), args)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # listing reads nothing: no host read, no warning
            _same_listing(got, want)
            if args:
                assert len(dict.keys(got.srcdata)) < len(got.srcdata)  # it holds fewer keys than it lists
    want, got = _pair(g, torch.arange(8), {"prefetch_node_feats": ["label"]})
    with pytest.warns(host_reads.HostReadWarning):
        as_dict = dict(got.srcdata)  # DGL reads every column of dict(view) too
        values = list(got.edata.values())
    ref = dict(want.srcdata)
    assert list(as_dict) == list(ref) and len(values) == len(want.edata)
    assert all(torch.equal(_by_id(as_dict[k], as_dict["_ID"]), _by_id(ref[k], ref["_ID"])) for k in ref)
    for block in (want, got):  # a key set goes last, a key deleted is gone: as DGL
        block.srcdata["h"] = torch.zeros(block.num_src_nodes())
        del block.srcdata["year"]
    _same_listing(got, want)


def test_a_heterograph_block_lists_every_key_per_type_as_dgl_without_reading_them():
    want, got = _pair(_hetero(), {"paper": torch.arange(8)}, {"prefetch_node_feats": {"paper": ["feat"]}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same_listing(got, want)
    for block in (want, got):
        block.srcdata["h"] = {"word": torch.zeros(block.num_src_nodes("word"))}
        del block.srcnodes["paper"].data["year"]
        del block.edges[CITES].data["w"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same_listing(got, want)
    with pytest.warns(host_reads.HostReadWarning):
        assert sorted(dict(got.srcnodes["word"].data)) == sorted(dict(want.srcnodes["word"].data))


def test_moves_and_copies_list_every_key_a_pickled_block_what_it_held_and_scopes_restore_as_dgl():
    g = _graph()
    want, got = _pair(g, torch.arange(8), {"prefetch_node_feats": ["label"]})
    for other in (got.to("cpu"), copy.deepcopy(got), copy.copy(got)):
        _same_listing(other, want)
    with pytest.warns(host_reads.HostReadWarning):
        got.srcdata["year"]
    assert list(pickle.loads(pickle.dumps(got)).srcdata) == ["_ID", "label", "year"]  # what it held
    for block in (want, got):
        with block.local_scope():
            del block.srcdata["x"]  # not read yet on the device block
            block.srcdata["h"] = torch.zeros(block.num_src_nodes())
        assert "x" in block.srcdata
    _same_listing(got, want)
    h_want, h_got = _pair(_hetero(), {"paper": torch.arange(8)}, {"prefetch_node_feats": {"paper": ["feat"]}})
    for block in (h_want, h_got):
        with block.local_scope():
            del block.srcnodes["paper"].data["year"]
            del block.srcdata["label"]
        rel = block["cites"]
        with rel.local_scope():  # a relation's own views
            del rel.srcdata["year"]
    _same_listing(h_got, h_want)
    back = pickle.loads(pickle.dumps(h_got))
    assert list(back.srcdata) == ["_ID", "feat"]
    with pytest.raises(KeyError, match="pickled"):  # it cannot tell whether the graph had the key
        back.srcdata["year"]
