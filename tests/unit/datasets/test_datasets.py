"""Offline datasets and the synthetic generator (issue 2).

Expected counts are the ones published in ``../shared/datasets/README.md``.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphtrainer import datasets
from graphtrainer.datasets import known

# name: (nodes, edges, feat dim, classes, (train, val, test)) from the datasets README.
# Tolokers' splits are 50/25/25 of 11,758 nodes; Facebook's is ours (60/20/20 per class).
EXPECTED = {
    "cora": (2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (3327, 9228, 3703, 6, (120, 500, 1000)),
    "tolokers": (11758, 1038000, 10, 2, (5879, 2939, 2940)),
    # 171,002 rows with 179 self-loops: 170,823 pairs both ways + 179 loops.
    "facebook": (22470, 2 * 170823 + 179, 4714, 4, None),
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv(datasets.CACHE_ENV, str(path))
    return path


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_dataset_matches_published_counts(name, cache):
    nodes, edges, dim, classes, splits = EXPECTED[name]
    g = datasets.load(name)
    assert g.num_nodes() == nodes
    assert g.num_edges() == edges
    assert g.ndata["feat"].shape == (nodes, dim) and g.ndata["feat"].dtype == torch.float32
    assert g.ndata["label"].dtype == torch.int64
    assert int(g.ndata["label"].max()) + 1 == classes and int(g.ndata["label"].min()) == 0
    masks = [g.ndata[f"{s}_mask"] for s in ("train", "val", "test")]
    assert all(m.dtype == torch.bool and m.shape == (nodes,) for m in masks)
    assert not (masks[0] & masks[1]).any() and not (masks[0] & masks[2]).any() and not (masks[1] & masks[2]).any()
    sizes = tuple(int(m.sum()) for m in masks)
    if splits is not None:
        assert sizes == splits
    else:  # facebook: stratified 60/20/20 per class, every node in one split
        assert sum(sizes) == nodes
        for c in range(classes):
            in_class = g.ndata["label"] == c
            n_c = int(in_class.sum())
            assert int((masks[0] & in_class).sum()) == 3 * n_c // 5
            assert int((masks[1] & in_class).sum()) == n_c // 5


def test_tolokers_has_ten_splits_and_split_selects_one(cache):
    g3 = datasets.load("tolokers", split=3)
    assert g3.ndata["train_masks"].shape == (11758, 10)
    assert torch.equal(g3.ndata["train_mask"], g3.ndata["train_masks"][:, 3])
    assert torch.equal(g3.ndata["test_mask"], g3.ndata["test_masks"][:, 3])
    g0 = datasets.load("tolokers", split=0)
    assert not torch.equal(g0.ndata["train_mask"], g3.ndata["train_mask"])
    with pytest.raises(ValueError, match="split must be an int in 0..9"):
        datasets.load("tolokers", split=10)


def test_facebook_split_is_seeded(cache):
    a, b = datasets.load("facebook", seed=0), datasets.load("facebook", seed=0)
    c = datasets.load("facebook", seed=1)
    assert torch.equal(a.ndata["train_mask"], b.ndata["train_mask"])
    assert not torch.equal(a.ndata["train_mask"], c.ndata["train_mask"])
    assert int(a.ndata["train_mask"].sum()) == int(c.ndata["train_mask"].sum())


@pytest.mark.parametrize("name", ["cora", "citeseer", "facebook"])
def test_second_load_uses_the_cache(name, cache, monkeypatch):
    first = datasets.load(name)
    written = [p for p in cache.rglob("*") if p.is_file()]
    assert written, "the first load wrote no cache"
    before = {p: p.stat().st_mtime_ns for p in written}

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the second load parsed the raw files again")

    if name == "facebook":
        monkeypatch.setattr(known, "_build_facebook", no_rebuild)
    else:
        cls = known._PinnedCora if name == "cora" else known._PinnedCiteseer
        monkeypatch.setattr(cls, "process", no_rebuild)
    second = datasets.load(name)
    assert {p: p.stat().st_mtime_ns for p in written} == before
    assert torch.equal(first.ndata["feat"], second.ndata["feat"])
    assert torch.equal(first.edges()[0], second.edges()[0])


def test_loading_leaves_the_data_folder_untouched(cache):
    root = datasets.data_root()
    before = _snapshot(root)
    for name in datasets.KNOWN:
        datasets.load(name)
        datasets.load(name)  # from the cache, where there is one
    assert _snapshot(root) == before
    assert any(cache.rglob("*.bin")), "caches belong in the cache folder"


def test_data_root_from_env_and_argument(tmp_path, cache, monkeypatch):
    real = datasets.data_root()
    # A copy of just Cora's raw folder, somewhere else: found through the env var and root=.
    other = tmp_path / "data"
    folder = other / "dgl" / "cora_v2_d697a464"
    folder.mkdir(parents=True)
    for f in (real / "dgl" / "cora_v2_d697a464").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv(datasets.DATA_ENV, str(other))
    assert datasets.data_root() == other.resolve()
    assert datasets.load("cora").num_nodes() == 2708
    monkeypatch.setenv(datasets.DATA_ENV, str(tmp_path / "nowhere"))
    assert datasets.load("cora", root=real).num_nodes() == 2708  # the argument wins


def test_missing_root_names_path_and_variable(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv(datasets.DATA_ENV, str(missing))
    with pytest.raises(FileNotFoundError) as info:
        datasets.load("cora")
    assert str(missing) in str(info.value) and datasets.DATA_ENV in str(info.value)


@pytest.mark.parametrize("name", list(datasets.KNOWN))
def test_root_without_the_files_names_the_missing_path(name, tmp_path, cache):
    empty = tmp_path / "empty"
    (empty / "dgl").mkdir(parents=True)
    (empty / "raw").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        datasets.load(name, root=empty)
    assert str(empty) in str(info.value) and datasets.DATA_ENV in str(info.value)
    assert list(cache.rglob("*.bin")) == []  # nothing downloaded or built


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError) as info:
        datasets.load("ogbn-papers100M")
    for name in datasets.KNOWN:
        assert name in str(info.value)


# ---- synthetic --------------------------------------------------------------------------
def _synth(seed=0, n=20000, deg=10.0):
    return datasets.synthetic(n, deg, 16, 4, seed=seed)


def test_synthetic_has_the_asked_for_size():
    g = datasets.synthetic(12345, 7.5, 24, 5, seed=3)
    assert g.num_nodes() == 12345
    assert g.num_edges() == round(12345 * 7.5)
    assert g.ndata["feat"].shape == (12345, 24)
    assert sorted(torch.unique(g.ndata["label"]).tolist()) == list(range(5))
    masks = [g.ndata[f"{s}_mask"] for s in ("train", "val", "test")]
    assert int(sum(m.long() for m in masks).max()) == 1 and int(sum(m.sum() for m in masks)) == 12345
    assert int(masks[0].sum()) == round(0.6 * 12345)
    src, dst = g.edges()
    assert not bool((src == dst).any()), "no self-loops"


def test_synthetic_is_deterministic_for_a_seed():
    a, b, c = _synth(0), _synth(0), _synth(1)
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(a.ndata[key], b.ndata[key]), key
    assert torch.equal(a.edges()[0], b.edges()[0]) and torch.equal(a.edges()[1], b.edges()[1])
    assert not torch.equal(a.edges()[0], c.edges()[0])
    assert not torch.equal(a.ndata["feat"], c.ndata["feat"])


def test_synthetic_degrees_are_skewed_and_labels_learnable():
    g = _synth(0, n=50000)
    deg = g.in_degrees().float()
    assert float(deg.max()) > 10 * float(deg.mean()), "a power-law-like tail has hubs"
    assert float(deg.median()) < float(deg.mean()), "most nodes are below the mean"
    src, dst = g.edges()
    label, feat = g.ndata["label"], g.ndata["feat"]
    homophily = float((label[src] == label[dst]).float().mean())
    assert homophily > 0.6, homophily  # chance is 1/4
    # Features separate classes partly (nearest class mean on training nodes beats chance),
    # and averaging over neighbours separates them better: a GNN has something to learn.
    train, test = g.ndata["train_mask"], g.ndata["test_mask"]
    means = torch.stack([feat[train & (label == c)].mean(0) for c in range(4)])
    own = float(((feat[test] @ means.T).argmax(1) == label[test]).float().mean())
    g.ndata["h"] = feat
    import dgl.function as fn

    g.update_all(fn.copy_u("h", "m"), fn.mean("m", "agg"))
    mixed = feat + g.ndata["agg"]
    nbr = float(((mixed[test] @ means.T).argmax(1) == label[test]).float().mean())
    assert own > 0.3, own
    assert nbr > own + 0.05, (own, nbr)


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_nodes=0), "num_nodes"),
    (dict(num_nodes=-5), "num_nodes"),
    (dict(avg_degree=-1.0), "avg_degree"),
    (dict(avg_degree=float("nan")), "avg_degree"),
    (dict(feat_dim=0), "feat_dim"),
    (dict(num_classes=0), "num_classes"),
    (dict(num_classes=1), "num_classes"),
    (dict(train_frac=1.5), "train_frac"),
    (dict(train_frac=0.7, val_frac=0.5), "train_frac \\+ val_frac"),
])
def test_synthetic_rejects_invalid_sizes_naming_the_argument(kwargs, name):
    args = dict(num_nodes=100, avg_degree=4.0, feat_dim=8, num_classes=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        datasets.synthetic(**args)


def test_no_dataset_code_downloads(monkeypatch, cache, tmp_path):
    """DGL's download helper must never run: make it fail loudly and load everything."""
    import dgl.data.utils

    def refuse(*args, **kwargs):
        raise AssertionError(f"download attempted: {args}")

    monkeypatch.setattr(dgl.data.utils, "download", refuse)
    monkeypatch.setattr(dgl.data.dgl_dataset, "download", refuse, raising=False)
    # The folders are pinned: another DGL_REPO (which changes DGL's own folder hashes)
    # must not make DGL look elsewhere and try to download.
    monkeypatch.setenv("DGL_REPO", "https://example.invalid/dgl/")
    for name in datasets.KNOWN:
        assert datasets.load(name).num_nodes() > 0


def test_default_data_folder_is_beside_the_checkout(monkeypatch):
    """Without GRAPHTRAINER_DATA, data is read from ../shared/datasets beside the repository
    (where CI and the README's quick start keep it), wherever the module sits in the package."""
    import pathlib

    import graphtrainer
    from graphtrainer.datasets.known import data_root

    monkeypatch.delenv("GRAPHTRAINER_DATA", raising=False)
    checkout = pathlib.Path(graphtrainer.__file__).resolve().parents[1]
    assert data_root() == (checkout.parent / "shared" / "datasets").resolve()
