"""Streaming, binned ROC-AUC and average precision: a fixed-size histogram per rank instead of
every score gathered to every rank.

:class:`~graphtrainer.evaluation.ranking.LinkScores` computes ROC-AUC and AP exactly by gathering every
rank's scores to every rank (10M scored edges: 40 MB of float32 per copy, more inside
scikit-learn). :class:`BinnedAUROC` keeps two histograms of ``bins`` counts (positives and
negatives) over ``[low, high]`` after an optional sigmoid, sums them over ranks (one
all-reduce of ``2 * bins`` float64) and computes ROC-AUC and AP from them. Scores that share a
bin count as ties, so the result differs from the exact one by at most
:attr:`BinnedAUROC.auc_error_bound` (half the tied positive-negative pairs' share), reported
beside it; scores outside ``[low, high]`` fall in the end bins.

Use with ``LinkScores(k, auc=False)``: call :meth:`update` with the same scores in each
evaluation step and :meth:`compute` on every rank at the epoch end.
"""
from __future__ import annotations

from typing import Dict

import torch

from .. import comm as gdist


class BinnedAUROC:
    """Histogram ROC-AUC/AP (see the module docstring).

    Args:
        bins: histogram size (memory: ``2 * bins`` float64 per rank).
        low, high: the range binned, after the sigmoid when ``sigmoid``.
        sigmoid: map logits to ``(0, 1)`` first (the default range then fits).
    """

    def __init__(self, bins: int = 100_000, low: float = 0.0, high: float = 1.0, sigmoid: bool = True):
        if bins < 2 or not high > low:
            raise ValueError(f"BinnedAUROC(bins={bins}, low={low}, high={high}): need bins >= 2 and high > low")
        self.bins, self.low, self.high, self.sigmoid = int(bins), float(low), float(high), sigmoid
        self._counts = torch.zeros(2, self.bins, dtype=torch.float64)  # row 0 negatives, row 1 positives
        #: After :meth:`compute`: the most the binned ROC-AUC can differ from the exact one.
        self.auc_error_bound = float("nan")

    def _bin(self, scores: torch.Tensor) -> torch.Tensor:
        s = scores.detach().reshape(-1).double().cpu()
        if self.sigmoid:
            s = torch.sigmoid(s)
        where = ((s - self.low) / (self.high - self.low) * self.bins).floor().long()
        return where.clamp_(0, self.bins - 1)

    def update(self, pos: torch.Tensor, neg: torch.Tensor) -> None:
        """Count a batch's positive and negative scores (any shapes)."""
        for row, scores in ((1, pos), (0, neg)):
            self._counts[row] += torch.bincount(self._bin(scores), minlength=self.bins).double()

    def compute(self) -> Dict[str, float]:
        """``{"auc": ..., "ap": ...}`` over every rank's counts; resets them. Must be called on
        all processes."""
        neg, pos = gdist.all_reduce(self._counts.clone())
        self._counts.zero_()
        n_pos, n_neg = float(pos.sum()), float(neg.sum())
        if n_pos == 0 or n_neg == 0:
            self.auc_error_bound = float("nan")
            return {"auc": float("nan"), "ap": float("nan")}
        below = torch.cumsum(neg, 0) - neg  # negatives in lower bins
        pairs = n_pos * n_neg
        auc = float((pos * (below + 0.5 * neg)).sum()) / pairs
        self.auc_error_bound = float(0.5 * (pos * neg).sum()) / pairs
        # AP: thresholds from the highest bin down, each bin one step of the PR curve.
        tp, fp = torch.cumsum(pos.flip(0), 0), torch.cumsum(neg.flip(0), 0)
        step = pos.flip(0) > 0
        ap = float((pos.flip(0)[step] / n_pos * tp[step] / (tp[step] + fp[step])).sum())
        return {"auc": auc, "ap": ap}
