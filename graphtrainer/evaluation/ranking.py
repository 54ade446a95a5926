"""Link-prediction ranking metrics under the two OGB protocols, exact over all ranks.

Two protocols rank a positive edge against different negatives, and give very different
numbers on the same scores; every name here says which one it follows.

- **Pooled negatives** (``pooled_hits@K``; OGB's ``ogbl-collab``, ``ogbl-ddi``, ``ogbl-ppa``):
  all negative scores of the evaluation form one pool, and a positive is a hit when it
  scores strictly above the K-th highest score of the whole pool. With ``n`` edges and
  ``k`` negatives each the pool holds ``n * k`` scores, so Hits@20 becomes hard as the
  evaluation set grows: it measures how many positives beat the best 20 of *all* negatives.
- **Per-edge negatives** (``mrr``, ``per_edge_hits@K``; OGB's ``ogbl-citation2``): each
  positive is ranked among its own ``k`` negatives only, ``rank = 1 + #(neg > pos) +
  0.5 * #(neg == pos)`` (ties count half, as OGB's optimistic/pessimistic mean), MRR is the
  mean of ``1 / rank`` and Hits@K the fraction with ``rank <= K``. This is what a user who
  draws ``k`` negatives per edge usually means.

ROC-AUC and AP (``auc``, ``ap``) compare every positive with every negative (scikit-learn).

Every rank scores its share of the evaluation edges (each edge on exactly one rank, with
the edge loader's deterministic negatives, see :class:`~graphtrainer.data.edge_loader.EdgeLoader`)
into a :class:`LinkScores`; :meth:`LinkScores.compute` combines the ranks exactly: per-edge
metrics as float64 sums, the pooled threshold from every rank's top K negatives, AUC/AP on
the gathered scores. The results equal one process scoring every edge.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from .. import comm as gdist


def roc_auc_ap(pos: torch.Tensor, neg: torch.Tensor) -> Dict[str, float]:
    """ROC-AUC and average precision of positives ``pos`` against negatives ``neg``."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    if pos.numel() == 0 or neg.numel() == 0:
        return {"auc": float("nan"), "ap": float("nan")}
    scores = torch.cat([pos.reshape(-1), neg.reshape(-1)]).double().cpu().numpy()
    labels = torch.cat([torch.ones(pos.numel()), torch.zeros(neg.numel())]).numpy()
    return {"auc": float(roc_auc_score(labels, scores)), "ap": float(average_precision_score(labels, scores))}


def per_edge_ranks(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """The rank of each ``pos[i]`` among ``[pos[i]] + neg[i, :]`` (1 is best; ties count half),
    float64 ``[n]``. ``neg``: ``[n, k]`` (or ``[n * k]``, each edge's ``k`` in a row)."""
    pos = pos.reshape(-1, 1).double()
    neg = neg.reshape(pos.shape[0], -1).double()
    return 1 + (neg > pos).sum(1).double() + 0.5 * (neg == pos).sum(1).double()


def per_edge_mrr(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Mean reciprocal rank, each positive among its own negatives (ogbl-citation2's MRR)."""
    return float((1.0 / per_edge_ranks(pos, neg)).mean()) if pos.numel() else float("nan")


def per_edge_hits_at_k(pos: torch.Tensor, neg: torch.Tensor, k: int) -> float:
    """Fraction of positives ranked ``<= k`` among their own negatives (ogbl-citation2's Hits@K)."""
    return float((per_edge_ranks(pos, neg) <= k).double().mean()) if pos.numel() else float("nan")


def pooled_hits_at_k(pos: torch.Tensor, neg: torch.Tensor, k: int) -> float:
    """Fraction of positives scored strictly above the ``k``-th highest of all negatives pooled
    (ogbl-collab/ddi/ppa's Hits@K; 1.0 when there are fewer than ``k`` negatives, as OGB)."""
    neg = neg.reshape(-1)
    if pos.numel() == 0:
        return float("nan")
    if neg.numel() < k:
        return 1.0
    threshold = torch.topk(neg.double(), k).values[-1]
    return float((pos.reshape(-1).double() > threshold).double().mean())


#: Earlier names: ``mrr`` is the per-edge MRR, ``hits_at_k`` the pooled Hits@K.
mrr = per_edge_mrr
hits_at_k = pooled_hits_at_k


def ranking_metrics(pos: torch.Tensor, neg: torch.Tensor, hits: Sequence[int] = (20,)) -> Dict[str, float]:
    """``auc``, ``ap``, ``mrr`` and, for each ``K`` in ``hits``, ``pooled_hits@K`` and
    ``per_edge_hits@K`` (see the module docstring for the two protocols).

    ``pos``: ``[n]`` scores of positive edges; ``neg``: ``[n, k]`` scores of each positive's
    own ``k`` negatives (``[m]`` is accepted when no per-edge metric is wanted: those are NaN).
    """
    out = roc_auc_ap(pos, neg)
    per_edge = neg.dim() == 2 and neg.shape[0] == pos.numel()
    out["mrr"] = per_edge_mrr(pos, neg) if per_edge else float("nan")
    for k in hits:
        out[f"pooled_hits@{k}"] = pooled_hits_at_k(pos, neg, k)
        out[f"per_edge_hits@{k}"] = per_edge_hits_at_k(pos, neg, k) if per_edge else float("nan")
    return out


class LinkScores:
    """Scores of one evaluation epoch on this rank; :meth:`compute` gives exact metrics.

    Call :meth:`add` in ``validation_step``/``test_step`` with each batch's positive scores
    ``[b]`` and negative scores (``[b * k]`` in the order of DGL's negative pair graph from
    :class:`~graphtrainer.data.edge_loader.PerEdgeUniform`, or ``[b, k]``), and :meth:`compute`
    in ``on_validation_epoch_end``/``on_test_epoch_end`` on every rank (it is collective).
    ``auc=False`` skips ROC-AUC/AP, the only metrics that gather every score to every rank.
    """

    def __init__(self, negatives_per_edge: int, hits: Sequence[int] = (20,), auc: bool = True):
        self.k = int(negatives_per_edge)
        self.hits = tuple(hits)
        self.auc = auc
        self._pos: List[torch.Tensor] = []
        self._neg: List[torch.Tensor] = []

    def add(self, pos: torch.Tensor, neg: torch.Tensor) -> None:
        pos = pos.detach().reshape(-1).float().cpu()
        neg = neg.detach().reshape(-1).float().cpu()
        if neg.numel() != pos.numel() * self.k:
            raise ValueError(f"LinkScores.add: {pos.numel()} positive scores need {pos.numel() * self.k} "
                             f"negative scores ({self.k} per edge), got {neg.numel()}")
        self._pos.append(pos)
        self._neg.append(neg.reshape(-1, self.k))

    def local(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """This rank's ``(pos [n], neg [n, k])`` so far."""
        pos = torch.cat(self._pos) if self._pos else torch.zeros(0)
        neg = torch.cat(self._neg) if self._neg else torch.zeros(0, self.k)
        return pos, neg

    def gather(self) -> tuple:
        """Every rank's ``(pos [n], neg [n, k])`` in rank order; clears this rank's.
        Must be called on all processes."""
        pos, neg = self.local()
        self._pos, self._neg = [], []
        return gdist.all_gather_tensor(pos), gdist.all_gather_tensor(neg)

    def compute(self, prefix: str = "") -> Dict[str, float]:
        """Exact metrics over every rank's scores, keyed ``prefix + name`` (``val_mrr``,
        ``val_pooled_hits@20``, ``val_per_edge_hits@20``, ``val_auc``, ...), plus
        ``prefix + "edges"``: how many positives were scored. Clears this rank's scores.
        Must be called on all processes."""
        pos, neg = self.local()
        ranks = per_edge_ranks(pos, neg)
        # float64 sums over ranks: [edges, sum 1/rank, hits per K, pooled hits per K]
        sums = [float(pos.numel()), float((1.0 / ranks).sum())]
        sums += [float((ranks <= k).sum()) for k in self.hits]
        thresholds = [self._pooled_threshold(neg, k) for k in self.hits]
        sums += [float((pos.double() > t).sum()) if t is not None else float(pos.numel()) for t in thresholds]
        total = gdist.all_reduce(torch.tensor(sums, dtype=torch.float64)).tolist()
        n, h = total[0], len(self.hits)
        nan = float("nan")
        out = {"mrr": total[1] / n if n else nan}
        for i, k in enumerate(self.hits):
            out[f"pooled_hits@{k}"] = total[2 + h + i] / n if n else nan
            out[f"per_edge_hits@{k}"] = total[2 + i] / n if n else nan
        if self.auc:
            out.update(roc_auc_ap(*self.gather()))
        self._pos, self._neg = [], []
        result = {f"{prefix}{name}": value for name, value in sorted(out.items())}
        result[f"{prefix}edges"] = n
        return result

    @staticmethod
    def _pooled_threshold(neg: torch.Tensor, k: int) -> "float | None":
        """The k-th highest negative over all ranks, from each rank's top k (None: fewer
        than k negatives in all, every positive is a hit as in OGB). Collective."""
        top = torch.topk(neg.reshape(-1).double(), min(k, neg.numel())).values
        pooled = gdist.all_gather_tensor(top)
        return float(torch.topk(pooled, k).values[-1]) if pooled.numel() >= k else None


# Plain metrics for a task's own epoch-end code (gathered predictions, or one batch).

def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC-AUC of binary ``labels`` given positive-class ``scores`` (scikit-learn)."""
    from sklearn.metrics import roc_auc_score

    labels = labels.detach().cpu().numpy()
    if len(set(labels.tolist())) < 2:
        return float("nan")
    return float(roc_auc_score(labels, scores.detach().float().cpu().numpy()))


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose arg-max equals the label, as a 0-d tensor (no host sync)."""
    if labels.numel() == 0:
        return torch.zeros((), device=logits.device)
    return (logits.argmax(dim=-1) == labels).float().mean()
