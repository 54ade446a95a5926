"""A reproducible, learnable random graph of any size, built in memory."""
from __future__ import annotations

import math

import torch

import dgl

from ._checks import _check_frac, _check_int

# Node weight exponent (w ∝ (i+1)^-alpha: degree tail exponent 1 + 1/alpha = 3) and the
# fraction of edges whose second endpoint is drawn from the first endpoint's class.
_SYN_ALPHA = 0.5
_SYN_HOMOPHILY = 0.75


def synthetic(num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int,
              seed: int = 0, train_frac: float = 0.6, val_frac: float = 0.2) -> dgl.DGLGraph:
    """A reproducible, learnable random graph with a skewed degree distribution.

    Same arguments (``seed`` included) → identical edges, features, labels and masks.
    Long because it is one recipe drawing from one generator in a fixed order.

    - Nodes: ``num_nodes``. Labels: balanced, ``randperm(N) % num_classes`` (int64).
    - Edges: exactly ``E = round(num_nodes * avg_degree)``. ``ceil(E / 2)`` endpoint
      pairs are sampled Chung–Lu style, each added in both directions (the last reverse
      dropped when E is odd): ``avg_degree`` is the mean in- and out-degree. Node weights are
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

    2M nodes, avg_degree 10, feat_dim 128, 16 classes: ~9 s on 2 CPU cores. Raises
    ``ValueError`` naming the argument when one is out of range (num_nodes < 1, avg_degree
    < 0 or not finite, feat_dim < 1, num_classes < 2, fractions outside [0, 1] or over 1 together).
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
