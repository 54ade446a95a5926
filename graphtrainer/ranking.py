"""Link-prediction ranking metrics, exact over all ranks.

Every rank scores its share of the evaluation edges (each edge on exactly one rank, see
:class:`~graphtrainer.data.edge_loader.EdgeLoader`) and keeps the scores in a
:class:`LinkScores`; at the end of the epoch :meth:`LinkScores.compute` gathers every
rank's scores and computes the metrics once on the whole set, so they equal a
single-process evaluation (ROC-AUC and AP are not means of per-batch values).

- ROC-AUC, AP: positives against every negative (scikit-learn).
- MRR: per positive edge, ``1 / rank`` among itself and its own ``k`` negatives
  (ties count half, so a constant scorer gets the expected rank), averaged.
- Hits@K: the fraction of positives scored above the K-th highest score of all negatives
  (the OGB link-prediction definition).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from . import comm as gdist


def roc_auc_ap(pos: torch.Tensor, neg: torch.Tensor) -> Dict[str, float]:
    """ROC-AUC and average precision of positives ``pos`` against negatives ``neg``."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    scores = torch.cat([pos.reshape(-1), neg.reshape(-1)]).double().cpu().numpy()
    labels = torch.cat([torch.ones(pos.numel()), torch.zeros(neg.numel())]).numpy()
    if pos.numel() == 0 or neg.numel() == 0:
        return {"auc": float("nan"), "ap": float("nan")}
    return {"auc": float(roc_auc_score(labels, scores)), "ap": float(average_precision_score(labels, scores))}


def mrr(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Mean reciprocal rank of each ``pos[i]`` among ``[pos[i]] + neg[i, :]``."""
    pos, neg = pos.reshape(-1, 1).double(), neg.reshape(pos.numel(), -1).double()
    rank = 1 + (neg > pos).sum(1).double() + 0.5 * (neg == pos).sum(1).double()
    return float((1.0 / rank).mean()) if pos.numel() else float("nan")


def hits_at_k(pos: torch.Tensor, neg: torch.Tensor, k: int) -> float:
    """Fraction of positives scored strictly above the ``k``-th highest negative score."""
    neg = neg.reshape(-1)
    if pos.numel() == 0:
        return float("nan")
    if neg.numel() < k:
        return 1.0
    threshold = torch.topk(neg.double(), k).values[-1]
    return float((pos.reshape(-1).double() > threshold).double().mean())


def ranking_metrics(pos: torch.Tensor, neg: torch.Tensor, hits: Sequence[int] = (20,)) -> Dict[str, float]:
    """``auc``, ``ap``, ``mrr`` and ``hits@K`` for each ``K`` in ``hits``.

    ``pos``: ``[n]`` scores of positive edges; ``neg``: ``[n, k]`` scores of each positive's
    own ``k`` negatives (``[m]`` is accepted when no MRR is wanted: then ``mrr`` is NaN).
    """
    out = roc_auc_ap(pos, neg)
    out["mrr"] = mrr(pos, neg) if neg.dim() == 2 and neg.shape[0] == pos.numel() else float("nan")
    for k in hits:
        out[f"hits@{k}"] = hits_at_k(pos, neg, k)
    return out


class LinkScores:
    """Scores of one evaluation epoch on this rank; :meth:`compute` gives exact metrics.

    Call :meth:`add` in ``validation_step``/``test_step`` with each batch's positive scores
    ``[b]`` and negative scores (``[b * k]`` in the order of DGL's negative pair graph from
    :class:`~graphtrainer.data.edge_loader.PerEdgeUniform`, or ``[b, k]``), and :meth:`compute`
    in ``on_validation_epoch_end``/``on_test_epoch_end`` on every rank (it is collective).
    """

    def __init__(self, negatives_per_edge: int, hits: Sequence[int] = (20,)):
        self.k = int(negatives_per_edge)
        self.hits = tuple(hits)
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

    def gather(self) -> tuple:
        """Every rank's ``(pos [n], neg [n, k])`` in rank order; clears this rank's. Collective."""
        pos = torch.cat(self._pos) if self._pos else torch.zeros(0)
        neg = torch.cat(self._neg) if self._neg else torch.zeros(0, self.k)
        self._pos, self._neg = [], []
        return gdist.all_gather_tensor(pos), gdist.all_gather_tensor(neg)

    def compute(self, prefix: str = "") -> Dict[str, float]:
        """Exact metrics over every rank's scores, keyed ``prefix + name`` (``val_auc``, ...),
        plus ``prefix + "edges"``: how many positives were scored. Collective."""
        pos, neg = self.gather()
        out = {f"{prefix}{name}": value for name, value in ranking_metrics(pos, neg, self.hits).items()}
        out[f"{prefix}edges"] = float(pos.numel())
        return out


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
