"""Offline datasets (node classification, link prediction splits, graph classification)
and a synthetic graph generator.

:func:`load` reads real datasets from a local, read-only data folder and never
downloads. The folder is, in order: the ``root=`` argument, ``$GRAPHTRAINER_DATA``,
or ``<repo root>/../shared/datasets``. Its layout is described in that folder's
``README.md`` (``dgl/<name>_<hash>/`` for DGL's own loaders, ``raw/`` for the rest).

Processed caches go to the cache folder, never into the data folder: the ``cache=``
argument, ``$GRAPHTRAINER_CACHE``, ``$XDG_CACHE_HOME/graphtrainer``, or
``~/.cache/graphtrainer``.

:func:`synthetic` builds a reproducible, learnable graph of any size in memory.
:func:`link_split` makes the classic 85/5/10 link-prediction split of a graph;
:func:`minigc` and :func:`read_tu` give graph-classification datasets (generated locally,
or read from TU-format text files the user brings).
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import math
import os
import pathlib
from typing import Dict, Iterator, Optional, Tuple, Union

import numpy as np
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402
import dgl.data  # noqa: E402

__all__ = ["DATA_ENV", "CACHE_ENV", "KNOWN", "data_root", "cache_dir", "load", "synthetic",
           "LinkSplit", "link_split", "minigc", "read_tu"]

DATA_ENV = "GRAPHTRAINER_DATA"
CACHE_ENV = "GRAPHTRAINER_CACHE"
KNOWN = ("cora", "citeseer", "tolokers", "facebook")

PathLike = Union[str, os.PathLike]

# Folders under <root>/dgl, named as dgl.data.DGLDataset.raw_path computes them for
# the default DGL_REPO (the hash is of the download URL). They are pinned here so a
# different $DGL_REPO cannot make DGL look elsewhere and try to download.
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

# synthetic(): node weight exponent (w_i ∝ (i+1)^-alpha gives a degree tail of
# exponent 1 + 1/alpha = 3) and the fraction of edges whose second endpoint is drawn
# from the first endpoint's class.
_SYN_ALPHA = 0.5
_SYN_HOMOPHILY = 0.75


# ---------------------------------------------------------------------------
# Folders
# ---------------------------------------------------------------------------

def data_root(root: Optional[PathLike] = None) -> pathlib.Path:
    """The data folder: ``root``, else ``$GRAPHTRAINER_DATA``, else
    ``<repo root>/../shared/datasets`` (repo root = parent of the ``graphtrainer``
    package folder), resolved to an absolute path. Existence is not checked here."""
    if root is None or str(root) == "":
        root = os.environ.get(DATA_ENV) or None
    if root is None:
        root = pathlib.Path(__file__).resolve().parent.parent / ".." / "shared" / "datasets"
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


# ---------------------------------------------------------------------------
# DGL's own loaders, pinned to local files
# ---------------------------------------------------------------------------

def _pinned(base):
    """A subclass of a DGL dataset class that reads ``raw_path`` and writes its
    processed cache to ``save_path`` exactly as given, and refuses to download.

    DGL 2.1's Planetoid classes take no ``save_dir`` and would otherwise write their
    cache into ``raw_dir`` (the read-only data folder)."""

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


# ---------------------------------------------------------------------------
# Facebook Page-Page (no DGL loader)
# ---------------------------------------------------------------------------

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
    """Per class c (ascending) with n_c nodes: a seeded random permutation of its
    nodes; the first floor(3 n_c / 5) are train, the next floor(n_c / 5) val, the
    rest test."""
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


# ---------------------------------------------------------------------------
# Public loader
# ---------------------------------------------------------------------------

def load(name: str, root: Optional[PathLike] = None, cache: Optional[PathLike] = None,
         split: int = 0, seed: int = 0, verbose: bool = False) -> dgl.DGLGraph:
    """Load a shipped dataset as a homogeneous DGL graph. Nothing is ever downloaded.

    ``ndata`` holds ``feat`` (float32 ``[N, F]``), ``label`` (int64 ``[N]``) and
    ``train_mask`` / ``val_mask`` / ``test_mask`` (bool ``[N]``).

    - ``"cora"``, ``"citeseer"``: DGL's ``CoraGraphDataset`` / ``CiteseerGraphDataset``
      on ``<root>/dgl``, public Planetoid split (140/500/1000, 120/500/1000). DGL's
      processed cache is written to ``<cache>/dgl/<folder>/``.
    - ``"tolokers"``: DGL's ``TolokersDataset`` on ``<root>/dgl`` (writes nothing; it
      re-reads the ``.npz`` each time). It has 10 fixed splits: ``split`` (0..9) picks
      the one given as 1-D masks; all ten stay in ``train_masks`` / ``val_masks`` /
      ``test_masks`` (bool ``[N, 10]``).
    - ``"facebook"``: Facebook Page-Page from ``<root>/raw/facebook_page_page``.
      22,470 nodes; ``feat`` is multi-hot over the 4,714 distinct feature ids (sorted
      ids → columns); ``label`` is ``page_type`` in sorted order (0 company,
      1 government, 2 politician, 3 tvshow). Edges: every non-loop row in both
      directions, self-loops once, duplicates removed: 341,825 edges (the 170,823
      non-loop rows twice, plus the 179 self-loops; the file has no duplicate rows). The split is seeded by ``seed`` and stratified: for each class with
      n_c nodes, a random permutation (``torch.Generator().manual_seed(seed)``, classes
      in ascending order) gives floor(3·n_c/5) train, floor(n_c/5) val, and the rest
      test. The graph (without masks, features stored sparse) is cached with
      ``dgl.save_graphs`` in ``<cache>/facebook_page_page/``, keyed by a version
      string and the raw files' sizes and mtimes; later loads read the cache.

    ``name`` is case-insensitive. ``split`` must be 0 for datasets with a single split;
    ``seed`` only affects ``"facebook"``. ``root`` and ``cache`` default as in
    :func:`data_root` and :func:`cache_dir`.

    Raises ``ValueError`` for an unknown name or split, and ``FileNotFoundError``
    (naming the path looked at) when the data folder or a dataset file is missing.
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


# ---------------------------------------------------------------------------
# Synthetic graphs
# ---------------------------------------------------------------------------

def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _check_frac(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


def synthetic(num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int,
              seed: int = 0, train_frac: float = 0.6, val_frac: float = 0.2) -> dgl.DGLGraph:
    """A reproducible, learnable random graph with a skewed degree distribution.

    Same arguments (``seed`` included) → identical edges, features, labels and masks.

    - Nodes: ``num_nodes``. Labels: balanced, ``randperm(N) % num_classes`` (int64).
    - Edges: exactly ``E = round(num_nodes * avg_degree)``. ``ceil(E / 2)`` endpoint
      pairs are sampled Chung–Lu style and each is added in both directions (the
      reverse of the last pair is dropped when E is odd), so the graph is symmetric
      and ``avg_degree`` is the mean in-degree (= mean out-degree). Node weights are
      ``w ∝ (r + 1)^-0.5`` over a random ranking r of the nodes (hubs have random ids;
      degree tail exponent ≈ 3; max degree ≈ 0.5·sqrt(N) × mean). The first endpoint
      is drawn ∝ w; the second, with probability 0.75, ∝ w among the first endpoint's
      class, else ∝ w over all nodes (edge homophily ≈ 0.75 + 0.25 / num_classes).
      Draws use inverse-CDF sampling (``torch.searchsorted`` on cumulative weights).
      No self-loops (a draw equal to its first endpoint is redrawn; after 8 rounds a
      uniform other node is used), except when ``num_nodes == 1``. Duplicate edges are
      kept (the graph is a multigraph, mostly between hubs); nodes may have degree 0.
    - Features (float32 ``[N, feat_dim]``): class mean ``mu_c ~ N(0, I / feat_dim)``
      plus ``N(0, I)`` noise, so features alone separate classes only partly and
      averaging over (homophilous) neighbours helps — a GNN beats an MLP and chance.
    - Masks: a seeded permutation; the first ``round(train_frac·N)`` nodes are train,
      the next ``round(val_frac·N)`` val (capped at N), the rest test.

    Build time, measured once on 2 CPU cores (torch 2.2.1, dgl 2.1.0):
    2,000,000 nodes, avg_degree 10 (20,000,000 edges), feat_dim 128, 16 classes: ~9 s.

    Raises ``ValueError`` naming the argument when num_nodes < 1, avg_degree < 0 (or
    not finite), feat_dim < 1, num_classes < 2, a fraction outside [0, 1], or
    ``train_frac + val_frac > 1``.
    """
    n = _check_int("num_nodes", num_nodes, 1)
    try:
        deg = float(avg_degree)
    except (TypeError, ValueError):
        raise ValueError(f"avg_degree must be a number >= 0, got {avg_degree!r}") from None
    if not math.isfinite(deg) or deg < 0:
        raise ValueError(f"avg_degree must be a finite number >= 0, got {avg_degree!r}")
    d = _check_int("feat_dim", feat_dim, 1)
    c = _check_int("num_classes", num_classes, 2)
    tf, vf = _check_frac("train_frac", train_frac), _check_frac("val_frac", val_frac)
    if tf + vf > 1.0 + 1e-9:
        raise ValueError(f"train_frac + val_frac must be <= 1, got {tf} + {vf}")

    gen = torch.Generator().manual_seed(int(seed))
    num_edges = int(round(n * deg))
    label = torch.randperm(n, generator=gen) % c

    # Node weights over a random ranking; nodes ordered by class for per-class draws.
    rank = torch.randperm(n, generator=gen)
    weight = (rank.double() + 1.0).pow_(-_SYN_ALPHA)
    order = torch.argsort(label, stable=True)
    cum = torch.cumsum(weight[order], 0)
    total = cum[-1]
    counts = torch.bincount(label, minlength=c)
    seg_end = torch.cumsum(counts, 0)                  # exclusive end (positions in order)
    seg_start = seg_end - counts
    cum0 = torch.cat([cum.new_zeros(1), cum])          # cum0[k] = weight before position k
    lo_c, hi_c = cum0[seg_start], cum0[seg_end]

    def draw(lo: torch.Tensor, hi: torch.Tensor, first: torch.Tensor, last: torch.Tensor):
        u = lo + torch.rand(lo.shape, generator=gen, dtype=torch.float64) * (hi - lo)
        pos = torch.searchsorted(cum, u, right=True)
        return order[torch.minimum(torch.maximum(pos, first), last)]

    m = (num_edges + 1) // 2
    zero = torch.zeros(m, dtype=torch.int64)
    src = draw(torch.zeros(m, dtype=torch.float64), total.expand(m), zero, zero + (n - 1))
    del zero
    homo = torch.rand(m, generator=gen) < _SYN_HOMOPHILY
    cls = label[src]
    lo = torch.where(homo, lo_c[cls], 0.0)
    hi = torch.where(homo, hi_c[cls], total)
    first = torch.where(homo, seg_start[cls], 0)
    last = torch.where(homo, seg_end[cls] - 1, n - 1)
    del cls
    dst = draw(lo, hi, first, last)
    if n > 1:
        for _ in range(8):
            bad = torch.nonzero(dst == src, as_tuple=True)[0]
            if bad.numel() == 0:
                break
            dst[bad] = draw(lo[bad], hi[bad], first[bad], last[bad])
        bad = torch.nonzero(dst == src, as_tuple=True)[0]
        if bad.numel():
            shift = torch.randint(1, n, (bad.numel(),), generator=gen)
            dst[bad] = (src[bad] + shift) % n
    del lo, hi, first, last, homo

    k = num_edges - m  # reverse edges: m, or m - 1 when num_edges is odd
    g = dgl.graph((torch.cat([src, dst[:k]]), torch.cat([dst, src[:k]])), num_nodes=n)
    del src, dst

    mu = torch.randn(c, d, generator=gen) / math.sqrt(d)
    feat = torch.randn(n, d, generator=gen)
    chunk = max(1, (1 << 22) // d)
    for s in range(0, n, chunk):
        feat[s:s + chunk] += mu[label[s:s + chunk]]

    perm = torch.randperm(n, generator=gen)
    n_train = int(round(tf * n))
    n_val = min(int(round(vf * n)), n - n_train)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[:n_train]] = True
    masks[1][perm[n_train:n_train + n_val]] = True
    masks[2][perm[n_train + n_val:]] = True

    g.ndata["feat"] = feat
    g.ndata["label"] = label
    g.ndata["train_mask"], g.ndata["val_mask"], g.ndata["test_mask"] = masks
    return g


# ---------------------------------------------------------------------------
# Link prediction split, graph classification data
# ---------------------------------------------------------------------------

class LinkSplit:
    """Edges of one graph split for link prediction (see :func:`link_split`).

    - ``graph``: the training graph: all nodes and ``ndata``; edge ``i < m`` is the ``i``-th
      training edge ``(u, v)`` and edge ``m + i`` its reverse ``(v, u)``.
    - ``train_eids``: ``arange(m)``, each undirected training edge once.
    - ``reverse_eids``: the reverse of every edge of ``graph``, for ``exclude="reverse_id"``.
    - ``val``, ``test``: ``(src, dst)`` node pairs of held-out edges, not in ``graph``.
    """

    def __init__(self, graph: dgl.DGLGraph, train_eids: torch.Tensor, reverse_eids: torch.Tensor,
                 val: Tuple[torch.Tensor, torch.Tensor], test: Tuple[torch.Tensor, torch.Tensor]):
        self.graph, self.train_eids, self.reverse_eids = graph, train_eids, reverse_eids
        self.val, self.test = val, test

    def __repr__(self) -> str:
        return (f"LinkSplit({self.graph.num_nodes()} nodes; undirected edges train/val/test "
                f"{self.train_eids.numel()}/{self.val[0].numel()}/{self.test[0].numel()})")


def link_split(graph: dgl.DGLGraph, val_frac: float = 0.05, test_frac: float = 0.10,
               seed: int = 0) -> LinkSplit:
    """The classic link-prediction split (as in the GAE paper): the graph's undirected
    edges, each once (self-loops and duplicates dropped), are permuted with ``seed``;
    ``test_frac`` of them (rounded down) are test edges, the next ``val_frac`` validation
    edges, and the rest (85 % by default) train. Node data is kept; edge data is not.
    Negatives are drawn by the loaders (:class:`~graphtrainer.edge_loader.PerEdgeUniform`).
    """
    val_frac, test_frac = _check_frac("val_frac", val_frac), _check_frac("test_frac", test_frac)
    if val_frac + test_frac >= 1:
        raise ValueError(f"val_frac + test_frac must be below 1, got {val_frac + test_frac}")
    src, dst = graph.edges()
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    keep = lo != hi
    n = graph.num_nodes()
    key = torch.unique(lo[keep].to(torch.int64) * n + hi[keep].to(torch.int64))  # sorted: reproducible
    if key.numel() < 3:
        raise ValueError(f"link_split: the graph has {key.numel()} undirected edges; need at least 3")
    key = key[torch.randperm(key.numel(), generator=torch.Generator().manual_seed(int(seed)))]
    u, v = key // n, key % n
    n_test, n_val = int(key.numel() * test_frac), int(key.numel() * val_frac)
    test = (u[:n_test], v[:n_test])
    val = (u[n_test:n_test + n_val], v[n_test:n_test + n_val])
    tu, tv = u[n_test + n_val:], v[n_test + n_val:]
    m = tu.numel()
    train = dgl.graph((torch.cat([tu, tv]), torch.cat([tv, tu])), num_nodes=n)
    for k, value in graph.ndata.items():
        train.ndata[k] = value
    reverse = torch.cat([torch.arange(m, 2 * m), torch.arange(m)])
    return LinkSplit(train, torch.arange(m), reverse, val, test)


def minigc(num_graphs: int = 1000, min_nodes: int = 10, max_nodes: int = 20, seed: int = 0) -> list:
    """DGL's ``MiniGCDataset`` (8 synthetic graph families, generated here, no download) as
    a list of ``(graph, label)``; each graph gets self-loops and ``ndata["feat"]``, its
    in-degree as a float column ``[N, 1]`` (the families differ in degree structure)."""
    _check_int("num_graphs", num_graphs, 1)
    if min_nodes < 10:
        raise ValueError(f"min_nodes={min_nodes}: MiniGCDataset needs at least 10 nodes per graph")
    # Always generated here: nothing read from or written to ~/.dgl (a cache other processes
    # could race on). Generation seeds numpy's global RNG with `seed`.
    ds = dgl.data.MiniGCDataset(num_graphs, min_nodes, max_nodes, seed=seed, save_graph=False,
                                 force_reload=True)
    out = []
    for i in range(len(ds)):
        g, label = ds[i]
        g = dgl.add_self_loop(g)
        g.ndata["feat"] = g.in_degrees().float().unsqueeze(1)
        out.append((g, torch.as_tensor(label, dtype=torch.int64)))
    return out


def read_tu(folder: PathLike, name: str) -> list:
    """A graph-classification dataset in the TU text format, as a list of ``(graph, label)``.

    Reads ``<name>_A.txt`` (one ``"i, j"`` edge per line, 1-based node ids over the whole
    dataset), ``<name>_graph_indicator.txt`` (the 1-based graph of each node) and
    ``<name>_graph_labels.txt`` (one label per graph; mapped to ``0..C-1`` in sorted order),
    and ``<name>_node_attributes.txt`` when present (comma-separated floats per node →
    ``ndata["feat"]``; otherwise ``feat`` is the in-degree, ``[N, 1]``). Graphs keep every
    edge as listed (TU files list both directions of undirected edges).
    """
    folder = pathlib.Path(folder)
    files = {k: folder / f"{name}_{k}.txt" for k in ("A", "graph_indicator", "graph_labels")}
    for path in files.values():
        if not path.is_file():
            raise FileNotFoundError(f"TU dataset {name!r}: {path} is missing (needs {name}_A.txt, "
                                    f"{name}_graph_indicator.txt and {name}_graph_labels.txt)")

    def rows(path: pathlib.Path) -> list:
        with open(path) as f:
            return [[float(x) for x in line.replace(",", " ").split()] for line in f if line.strip()]

    indicator = torch.tensor([int(r[0]) for r in rows(files["graph_indicator"])], dtype=torch.int64) - 1
    raw_labels = [r[0] for r in rows(files["graph_labels"])]
    num_graphs = len(raw_labels)
    if num_graphs == 0:
        raise ValueError(f"TU dataset {name!r}: {files['graph_labels']} lists no graphs")
    if indicator.numel() == 0 or int(indicator.min()) < 0 or int(indicator.max()) >= num_graphs:
        raise ValueError(f"TU dataset {name!r}: graph ids in {files['graph_indicator']} must lie in "
                         f"[1, {num_graphs}]")
    edges = torch.tensor(rows(files["A"]), dtype=torch.int64).reshape(-1, 2) - 1
    num_nodes = indicator.numel()
    if edges.numel() and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
        raise ValueError(f"TU dataset {name!r}: node ids in {files['A']} must lie in [1, {num_nodes}]")
    attr_path = folder / f"{name}_node_attributes.txt"
    feat = torch.tensor(rows(attr_path), dtype=torch.float32) if attr_path.is_file() else None
    if feat is not None and feat.shape[0] != num_nodes:
        raise ValueError(f"TU dataset {name!r}: {attr_path} has {feat.shape[0]} rows for {num_nodes} nodes")
    classes = {v: i for i, v in enumerate(sorted(set(raw_labels)))}
    labels = torch.tensor([classes[v] for v in raw_labels], dtype=torch.int64)
    if edges.numel() and bool((indicator[edges[:, 0]] != indicator[edges[:, 1]]).any()):
        raise ValueError(f"TU dataset {name!r}: an edge in {files['A']} joins two different graphs")
    if bool((indicator[1:] < indicator[:-1]).any()):
        raise ValueError(f"TU dataset {name!r}: {files['graph_indicator']} must list each graph's nodes "
                         "together, graphs in ascending order (as the TU format does)")
    # Nodes of a graph are contiguous in the TU format; first node id of each graph:
    counts = torch.bincount(indicator, minlength=num_graphs)
    first = torch.cumsum(counts, 0) - counts
    edge_graph = indicator[edges[:, 0]] if edges.numel() else torch.zeros(0, dtype=torch.int64)
    out = []
    for gi in range(num_graphs):
        e = edges[edge_graph == gi] - first[gi]
        g = dgl.graph((e[:, 0], e[:, 1]), num_nodes=int(counts[gi]))
        nodes = slice(int(first[gi]), int(first[gi] + counts[gi]))
        g.ndata["feat"] = feat[nodes] if feat is not None else g.in_degrees().float().unsqueeze(1)
        out.append((g, labels[gi]))
    return out


# Heterographs live in their own module; imported last (it uses load and synthetic).
from .hetero_data import cora_hetero, synthetic_hetero  # noqa: E402

__all__ += ["cora_hetero", "synthetic_hetero"]
