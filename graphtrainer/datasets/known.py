"""Real datasets read from the local, read-only data folder (never downloaded): Cora,
CiteSeer, Tolokers (DGL's loaders pinned to local files) and Facebook Page-Page; processed
caches go to the cache folder (see :mod:`graphtrainer.datasets`)."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import os
import pathlib
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402
import dgl.data  # noqa: E402

from ._checks import PathLike  # noqa: E402

DATA_ENV = "GRAPHTRAINER_DATA"
CACHE_ENV = "GRAPHTRAINER_CACHE"
KNOWN = ("cora", "citeseer", "tolokers", "facebook")

# Folders under <root>/dgl as DGLDataset.raw_path names them for the default DGL_REPO (hash of the
# URL), pinned so another $DGL_REPO cannot make DGL look elsewhere and download.
_DGL_FOLDERS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "cora": ("cora_v2_d697a464", tuple(
        f"ind.cora_v2.{s}" for s in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"))),
    "citeseer": ("citeseer_d6836239", tuple(
        f"ind.citeseer.{s}" for s in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"))),
    "tolokers": ("tolokers_911b7b2c", ("tolokers.npz",)),
}
_TOLOKERS_SPLITS = 10

_FACEBOOK_DIR = ("raw", "facebook_page_page")
_FACEBOOK_FILES = ("facebook_edges.csv", "facebook_target.csv", "facebook_features.json")
# Bump when the facebook graph built by _build_facebook changes: old caches are ignored.
_FACEBOOK_VERSION = "facebook-v1"


def data_root(root: Optional[PathLike] = None) -> pathlib.Path:
    """The data folder, absolute: ``root``, else ``$GRAPHTRAINER_DATA``, else ``../shared/datasets``
    beside the folder holding the ``graphtrainer`` package. Existence is not checked here."""
    if root is None or str(root) == "":
        root = os.environ.get(DATA_ENV) or None
    if root is None:
        # This file is graphtrainer/datasets/known.py: parents[2] is the checkout.
        root = pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets"
    return pathlib.Path(root).expanduser().resolve()


def cache_dir(cache: Optional[PathLike] = None) -> pathlib.Path:
    """The cache folder, created if missing: ``cache``, else ``$GRAPHTRAINER_CACHE``,
    else ``$XDG_CACHE_HOME/graphtrainer``, else ``~/.cache/graphtrainer``."""
    if cache is None or str(cache) == "":
        cache = os.environ.get(CACHE_ENV) or None
    if cache is None:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
        cache = base / "graphtrainer"
    path = pathlib.Path(cache).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _missing(path: pathlib.Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{what} not found: looked at {path}. Set {DATA_ENV} to the data folder "
        f"(the one holding dgl/ and raw/) or pass root=.")


def _check_root(root: pathlib.Path) -> None:
    if not root.is_dir():
        raise _missing(root, "data folder")


def _check_files(folder: pathlib.Path, files) -> None:
    if not folder.is_dir():
        raise _missing(folder, "dataset folder")
    for name in files:
        if not (folder / name).is_file():
            raise _missing(folder / name, "dataset file")


def _pinned(base):
    """``base`` reading ``raw_path`` and caching to ``save_path`` as given, never downloading
    (DGL 2.1's Planetoid classes take no ``save_dir`` and cache into the read-only ``raw_dir``)."""

    class Pinned(base):
        def __init__(self, *, raw_path: str, save_path: str, **kwargs):
            self._gt_raw_path = raw_path
            self._gt_save_path = save_path
            super().__init__(**kwargs)

        @property
        def raw_path(self):
            return self._gt_raw_path

        @property
        def save_dir(self):
            return os.path.dirname(self._gt_save_path)

        @property
        def save_path(self):
            return self._gt_save_path

        def download(self):
            raise FileNotFoundError(
                f"{base.__name__}: raw files missing under {self._gt_raw_path}; "
                "graphtrainer never downloads.")

    Pinned.__name__ = Pinned.__qualname__ = f"Pinned{base.__name__}"
    return Pinned


_PinnedCora = _pinned(dgl.data.CoraGraphDataset)
_PinnedCiteseer = _pinned(dgl.data.CiteseerGraphDataset)
_PinnedTolokers = _pinned(dgl.data.TolokersDataset)


def _load_planetoid(name: str, root: pathlib.Path, cache: Optional[PathLike],
                    verbose: bool) -> dgl.DGLGraph:
    folder, files = _DGL_FOLDERS[name]
    raw = root / "dgl" / folder
    _check_files(raw, files)  # DGL downloads when raw_path is missing: never let it
    save = cache_dir(cache) / "dgl" / folder
    cls = _PinnedCora if name == "cora" else _PinnedCiteseer
    with _exclusive(save.with_name(save.name + ".lock")):  # DGL writes its cache non-atomically
        ds = cls(raw_path=str(raw), save_path=str(save), raw_dir=str(root / "dgl"),
                 verbose=verbose)
    return ds[0]


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path) -> Iterator[None]:
    """One process at a time (ranks of a job loading the same dataset at once)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # never truncated: its mtime stays put
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _load_tolokers(root: pathlib.Path, split: int, verbose: bool) -> dgl.DGLGraph:
    folder, files = _DGL_FOLDERS["tolokers"]
    raw = root / "dgl" / folder
    _check_files(raw, files)
    # TolokersDataset writes nothing (its "cache" is the raw .npz); save_path is unused.
    ds = _PinnedTolokers(raw_path=str(raw), save_path=str(raw), raw_dir=str(root / "dgl"),
                         verbose=verbose)
    g = ds[0]
    for part in ("train", "val", "test"):
        full = g.ndata.pop(f"{part}_mask").bool()
        g.ndata[f"{part}_masks"] = full
        g.ndata[f"{part}_mask"] = full[:, split].clone()
    return g


def _build_facebook(folder: pathlib.Path) -> Tuple[dgl.DGLGraph, Dict[str, torch.Tensor]]:
    """Parse the raw files into a graph (``label`` only) plus the multi-hot features
    as COO index tensors (``feat_rows``, ``feat_cols``, ``feat_dim``)."""
    with open(folder / "facebook_target.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ids = np.array([int(r["id"]) for r in rows], dtype=np.int64)
    n = len(ids)
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise ValueError(f"{folder / 'facebook_target.csv'}: ids are not 0..{n - 1}")
    types = np.empty(n, dtype=object)
    types[ids] = [r["page_type"] for r in rows]
    classes = sorted(set(types.tolist()))
    label = np.searchsorted(np.array(classes, dtype=object), types).astype(np.int64)

    with open(folder / "facebook_edges.csv", newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader)
        e = np.array([(int(a), int(b)) for a, b in reader], dtype=np.int64).reshape(-1, 2)
    u, v = e[:, 0], e[:, 1]
    if e.size and (e.min() < 0 or e.max() >= n):
        raise ValueError(f"{folder / 'facebook_edges.csv'}: node id outside 0..{n - 1}")
    loop = u == v
    src = np.concatenate([u[~loop], v[~loop], u[loop]])
    dst = np.concatenate([v[~loop], u[~loop], v[loop]])
    key = np.unique(src * n + dst)  # dedupe, sorted by (src, dst)
    g = dgl.graph((torch.from_numpy(key // n), torch.from_numpy(key % n)), num_nodes=n)
    g.ndata["label"] = torch.from_numpy(label)

    with open(folder / "facebook_features.json", encoding="utf-8") as f:
        feats = json.load(f)
    frows, fids = [], []
    for node, fid_list in feats.items():
        node = int(node)
        if not 0 <= node < n:
            raise ValueError(f"{folder / 'facebook_features.json'}: node {node} outside 0..{n - 1}")
        frows.extend([node] * len(fid_list))
        fids.extend(fid_list)
    frows = np.asarray(frows, dtype=np.int64)
    distinct, fcols = np.unique(np.asarray(fids, dtype=np.int64), return_inverse=True)
    extra = {
        "feat_rows": torch.from_numpy(frows),
        "feat_cols": torch.from_numpy(fcols.astype(np.int64)),
        "feat_dim": torch.tensor([len(distinct)], dtype=torch.int64),
    }
    return g, extra


def _facebook_cache_path(folder: pathlib.Path, cache: Optional[PathLike]) -> pathlib.Path:
    h = hashlib.sha1(_FACEBOOK_VERSION.encode())
    for name in _FACEBOOK_FILES:
        st = (folder / name).stat()
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return cache_dir(cache) / "facebook_page_page" / f"{_FACEBOOK_VERSION}-{h.hexdigest()[:12]}.bin"


def _stratified_masks(label: torch.Tensor, seed: int) -> Tuple[torch.Tensor, ...]:
    """Per class (ascending), a permutation of its n_c nodes from
    ``torch.Generator().manual_seed(seed)``: floor(3 n_c / 5) train, floor(n_c / 5) val, the rest test."""
    gen = torch.Generator().manual_seed(int(seed))
    n = label.numel()
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for c in torch.unique(label).tolist():
        idx = torch.nonzero(label == c, as_tuple=True)[0]
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        n_tr, n_va = (3 * idx.numel()) // 5, idx.numel() // 5
        masks[0][idx[:n_tr]] = True
        masks[1][idx[n_tr:n_tr + n_va]] = True
        masks[2][idx[n_tr + n_va:]] = True
    return tuple(masks)


def _load_facebook(root: pathlib.Path, cache: Optional[PathLike], seed: int,
                   verbose: bool) -> dgl.DGLGraph:
    folder = root.joinpath(*_FACEBOOK_DIR)
    _check_files(folder, _FACEBOOK_FILES)
    path = _facebook_cache_path(folder, cache)
    g = extra = None
    if path.is_file():
        try:
            graphs, extra = dgl.load_graphs(str(path))
            g = graphs[0]
            if verbose:
                print(f"facebook: loaded cache {path}")
        except Exception as exc:  # corrupt or foreign file: rebuild it
            if verbose:
                print(f"facebook: cache {path} unreadable ({exc}); rebuilding")
            g = None
    if g is None:
        g, extra = _build_facebook(folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        dgl.save_graphs(str(tmp), [g], extra)
        os.replace(tmp, path)  # atomic: concurrent ranks never see half a file
        if verbose:
            print(f"facebook: built from {folder}, cached at {path}")
    n = g.num_nodes()
    feat = torch.zeros(n, int(extra["feat_dim"][0]), dtype=torch.float32)
    feat[extra["feat_rows"], extra["feat_cols"]] = 1.0
    g.ndata["feat"] = feat
    g.ndata["train_mask"], g.ndata["val_mask"], g.ndata["test_mask"] = \
        _stratified_masks(g.ndata["label"], seed)
    return g


def load(name: str, root: Optional[PathLike] = None, cache: Optional[PathLike] = None,
         split: int = 0, seed: int = 0, verbose: bool = False) -> dgl.DGLGraph:
    """Load a shipped dataset as a homogeneous DGL graph. Nothing is ever downloaded.

    ``ndata`` holds ``feat`` (float32 ``[N, F]``), ``label`` (int64 ``[N]``) and
    ``train_mask`` / ``val_mask`` / ``test_mask`` (bool ``[N]``).

    - ``"cora"``, ``"citeseer"``: DGL's loaders on ``<root>/dgl``, public Planetoid split
      (140/500/1000, 120/500/1000), DGL's cache in ``<cache>/dgl/<folder>/``.
    - ``"tolokers"``: DGL's ``TolokersDataset`` on ``<root>/dgl`` (no cache). ``split`` (0..9)
      picks one of its 10 fixed splits as 1-D masks; all ten stay in ``train_masks`` /
      ``val_masks`` / ``test_masks`` (bool ``[N, 10]``).
    - ``"facebook"``: Facebook Page-Page from ``<root>/raw/facebook_page_page``: 22,470
      nodes; ``feat`` multi-hot over the 4,714 feature ids (sorted); ``label`` the sorted
      ``page_type`` (0 company, 1 government, 2 politician, 3 tvshow); non-loop edges in both
      directions, the 179 self-loops once: 341,825. The split is stratified, seeded by
      ``seed`` (:func:`_stratified_masks`); the graph is cached in
      ``<cache>/facebook_page_page/``, keyed by a version and the raw files' sizes and mtimes.

    ``name`` is case-insensitive; ``split`` is 0 for single-split datasets; ``seed`` only
    affects ``"facebook"``; ``root`` and ``cache`` default as in :func:`data_root` and
    :func:`cache_dir`. Raises ``ValueError`` for an unknown name or split, and
    ``FileNotFoundError`` naming the path when the data folder or a dataset file is missing.
    """
    key = str(name).strip().lower()
    if key not in KNOWN:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(KNOWN)}")
    n_splits = _TOLOKERS_SPLITS if key == "tolokers" else 1
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) \
            or not 0 <= split < n_splits:
        raise ValueError(f"split must be an int in 0..{n_splits - 1} for {key!r}, got {split!r}")
    split = int(split)
    path = data_root(root)
    _check_root(path)
    if key in ("cora", "citeseer"):
        g = _load_planetoid(key, path, cache, verbose)
    elif key == "tolokers":
        g = _load_tolokers(path, split, verbose)
    else:
        g = _load_facebook(path, cache, seed, verbose)
    g.ndata["feat"] = g.ndata["feat"].float()
    g.ndata["label"] = g.ndata["label"].long()
    for part in ("train", "val", "test"):
        g.ndata[f"{part}_mask"] = g.ndata[f"{part}_mask"].bool()
    return g
