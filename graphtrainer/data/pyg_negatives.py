"""``neg_sampling=`` in every form PyG's ``LinkNeighborLoader`` takes it: a mode (``"binary"``,
``"triplet"``), a ``torch_geometric.sampler.NegativeSampling``, a dict or a tuple of its fields
(``mode``, ``amount``, ``src_weight``, ``dst_weight``); and setting an edge loader's negatives
(:class:`~graphtrainer.data.edge_loader.PerEdgeUniform`) to draw as it says.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Union

from ..nn.pyg import NEG_SAMPLING
from .negative_draws import NodeWeights, check_amount

_FIELDS = ("mode", "amount", "src_weight", "dst_weight")


class NegSpec(NamedTuple):
    """A ``neg_sampling=`` read: its mode, and (given as PyG's object, a dict or a tuple) the
    amount per positive edge and the node weights of the drawn ends."""
    mode: str
    amount: Optional[Union[int, float]] = None
    src_weight: Any = None
    dst_weight: Any = None


def _shown(value: Any) -> str:
    """``value`` for an error message, a tensor as its shape (weights may have millions of rows)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (int, float)):
        return f"<{type(value).__name__} of shape {tuple(shape)}>"
    return repr(value) if isinstance(value, (str, int, float, type(None))) else type(value).__name__


def read_neg_sampling(value: Any) -> NegSpec:
    """``value`` as a :class:`NegSpec` (``None``: binary), or a ``ValueError`` naming the forms taken."""
    if value is None or isinstance(value, str):
        fields = {"mode": "binary" if value is None else value}
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(_FIELDS), key=str)
        if unknown or "mode" not in value:
            wrong = f"unknown: {unknown}" if unknown else "no mode given"
            raise ValueError(f"neg_sampling={_shown(value)}: a dict takes PyG's NegativeSampling fields "
                             f"{list(_FIELDS)}, 'mode' among them; {wrong}")
        fields = dict(value)
    elif isinstance(value, tuple) and 1 <= len(value) <= len(_FIELDS):
        fields = dict(zip(_FIELDS, value))
    elif hasattr(value, "mode") and hasattr(value, "amount"):  # PyG's NegativeSampling (duck-typed: no import)
        fields = {name: getattr(value, name, None) for name in _FIELDS}
    else:
        raise ValueError(f"neg_sampling={_shown(value)}: give 'binary' or 'triplet', or PyG's NegativeSampling(mode, "
                         "amount, src_weight, dst_weight), a dict or a tuple of those fields")
    mode = getattr(fields["mode"], "value", fields["mode"])  # PyG's NegativeSamplingMode
    if mode not in NEG_SAMPLING:
        raise ValueError(f"neg_sampling={_shown(value)}: choose 'binary' (edge_label_index and edge_label; each "
                         "negative pair drawn at both ends, as PyG's) or 'triplet' (src_index, dst_pos_index and "
                         "dst_neg_index; negatives keep the positive's source). How many: negatives=k, or PyG's "
                         "NegativeSampling(mode, amount)")
    if isinstance(value, str) or value is None:
        return NegSpec(mode)
    amount = check_amount(fields.get("amount", 1), "neg_sampling amount")
    return NegSpec(mode, amount, fields.get("src_weight"), fields.get("dst_weight"))


def take_amount(negatives: Any, drawn_here: bool, spec: NegSpec) -> None:
    """Set the loader's negatives to ``spec.amount`` per positive edge, or a ``ValueError`` where
    the loader was asked for other negatives (``negatives=`` other than its default 1 and the amount)."""
    if spec.amount is None:
        return
    shown = f"neg_sampling with amount={spec.amount}"
    if negatives is None:
        raise ValueError(f"{shown} draws negatives, and the loader was given negatives=None (none). Fix: leave "
                         "negatives= at its default (the amount is neg_sampling's), or give neg_sampling='binary' "
                         "for batches of the positive pairs alone")
    if not drawn_here:
        raise ValueError(f"{shown} draws graphtrainer's negatives (per seed, epoch and edge), and the loader has "
                         f"its own sampler, negatives={type(negatives).__name__}(...). Fix: drop one of the two")
    if negatives.amount not in (1, spec.amount):
        raise ValueError(f"negatives={negatives.amount} and {shown} disagree: give the amount once (neg_sampling's, "
                         "negatives= left at its default)")
    negatives.amount, negatives.k = spec.amount, math.ceil(spec.amount)


def take_weights(negatives: Any, graph: Any, spec: NegSpec) -> None:
    """Set (or clear) the node weights the negatives' ends are drawn by, checked against ``graph``."""
    if spec.src_weight is not None and spec.mode == "triplet":
        raise ValueError("neg_sampling='triplet' keeps each positive's source, so src_weight draws nothing: drop "
                         "it (dst_weight weighs the drawn destinations), or use mode='binary'")
    if (spec.src_weight is not None or spec.dst_weight is not None) and type(graph).__name__ == "DistGraph":
        raise ValueError("neg_sampling's src_weight/dst_weight on a DistGraph: not supported (its node ids are "
                         "the partitions'); drop the weights to draw uniformly")
    n = graph.num_nodes()
    negatives.src_weight = None if spec.src_weight is None else NodeWeights(spec.src_weight, n, "src_weight")
    negatives.dst_weight = None if spec.dst_weight is None else NodeWeights(spec.dst_weight, n, "dst_weight")
