"""How many negatives a batch draws and where their ends fall, from hashed draws.

:class:`~graphtrainer.data.edge_loader.PerEdgeUniform` hashes ``(seed, epoch, edge, j)`` into
non-negative ints below ``2**31 - 1``; this module turns them into node ids, uniform or by node
weights (:class:`NodeWeights`, PyG's ``src_weight``/``dst_weight``), and keeps the first
``ceil(p * amount)`` of a batch's draws for a fractional amount (PyG's binary ratio). Only integer
arithmetic, so the CPU and a device pick the same nodes.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Union

import torch

#: Resolution of the weights' cumulative table: a node's share is a multiple of 1/_SCALE, so
#: the hash (below 2**31 - 1) spans it; a weight under about 5e-10 of the total is never drawn.
_SCALE = 2147483646


def check_amount(amount: Any, what: str = "negatives") -> Union[int, float]:
    """``amount`` (negatives per positive edge) as an int where it is whole, else the float; a
    ``ValueError`` naming the fix for what is not a positive finite number."""
    number = isinstance(amount, (int, float)) and not isinstance(amount, bool)
    if not number or not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"{what}={amount!r}: give k, the negatives per positive edge: an int of 1 or more, or a "
                         "positive float for PyG's binary ratio (0.5: one negative per two positives in a batch)")
    return int(amount) if float(amount).is_integer() else float(amount)


def kept_draws(num_edges: int, amount: Union[int, float], device: torch.device) -> Optional[torch.Tensor]:
    """Which of ``[num_edges, ceil(amount)]`` draws a batch keeps, edge by edge (``None``: all).

    PyG's binary negatives are ``ceil(p * amount)`` per batch of ``p`` positives: every edge's
    first ``floor(amount)`` draws, and one more for the batch's first edges until the count is met."""
    if isinstance(amount, int):
        return None
    whole = math.floor(amount)
    extra = math.ceil(num_edges * amount) - num_edges * whole  # PyG's count, its float product included
    j = torch.arange(whole + 1, device=device).unsqueeze(0)
    i = torch.arange(num_edges, device=device).unsqueeze(1)
    return (j < whole) | ((j == whole) & (i < extra))


class NodeWeights:
    """Node ids drawn in proportion to ``weight`` (PyG's ``src_weight``/``dst_weight``: need not
    sum to 1; a node of weight 0 is never drawn), from hashed draws; ``what`` names it in errors."""

    def __init__(self, weight: Any, num_nodes: int, what: str):
        try:
            w = torch.as_tensor(weight).detach().to("cpu", torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{what}: give one non-negative weight per node, a 1-D tensor ({exc})") from None
        if w.dim() != 1 or w.numel() != num_nodes:
            raise ValueError(f"{what}: one weight per node of the graph ({num_nodes}), a 1-D tensor; got shape "
                             f"{tuple(w.shape)}")
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise ValueError(f"{what}: weights must be finite and non-negative (a node of weight 0 is never drawn)")
        total = torch.cumsum(w, 0)
        if num_nodes == 0 or float(total[-1]) <= 0:
            raise ValueError(f"{what}: the weights sum to 0, so no node can be drawn; give some node a positive weight")
        self.what, self.num_nodes = what, num_nodes
        # Integer bounds: node i owns [cdf[i-1], cdf[i]); equal bounds (weight 0) own nothing.
        self.cdf = torch.floor(total / total[-1] * _SCALE).to(torch.int64)
        self._placed: Dict[torch.device, torch.Tensor] = {}

    def pick(self, drawn: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """The node of each hashed draw in ``drawn`` (int64, any shape), on its device."""
        if num_nodes != self.num_nodes:
            raise ValueError(f"{self.what} has {self.num_nodes} weights, but negatives are drawn among {num_nodes} "
                             "nodes: give one weight per node of the graph the loader samples")
        cdf = self._placed.get(drawn.device)
        if cdf is None:
            cdf = self._placed[drawn.device] = self.cdf.to(drawn.device)
        return torch.searchsorted(cdf, (drawn % _SCALE).contiguous(), right=True)

    def __getstate__(self) -> Dict[str, Any]:  # to sampling workers: the table, not its device copies
        return {**self.__dict__, "_placed": {}}
