"""``HeteroGraphConv``: one layer per relation of a heterograph, outputs aggregated per
destination type; takes a DGL heterograph/block or a :class:`TorchHeteroBlock`. Same
arguments, parameter names (``mods.<relation>``) and results as ``dgl.nn.HeteroGraphConv``."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch import nn

from .blocks import TorchHeteroBlock
from .convert import is_dgl_graph

AGGREGATES = ("sum", "mean", "max", "min", "stack")


def _aggregate_fn(name: str) -> Callable[[List[torch.Tensor], str], Optional[torch.Tensor]]:
    if name not in AGGREGATES:
        raise ValueError(f"graphtrainer.nn.HeteroGraphConv: aggregate={name!r}; choose one of {list(AGGREGATES)} "
                         "or pass a function(list of tensors, dst type)")
    if name == "stack":
        return lambda xs, _nt: torch.stack(xs, dim=1) if xs else None
    reduce = {"sum": torch.sum, "mean": torch.mean,
              "max": lambda t, dim: torch.max(t, dim=dim)[0], "min": lambda t, dim: torch.min(t, dim=dim)[0]}[name]
    return lambda xs, _nt: reduce(torch.stack(xs, dim=0), dim=0) if xs else None


class HeteroGraphConv(nn.Module):
    """``mods``: ``{relation name or (src, rel, dst): layer}``, each fed ``(src inputs, dst
    inputs)`` (relations without source inputs skipped, as in DGL); ``aggregate`` ("sum", "mean",
    "max", "min", "stack" or a callable) combines those reaching one destination type."""

    def __init__(self, mods: Dict[Any, nn.Module], aggregate: Union[str, Callable[..., Any]] = "sum"):
        super().__init__()
        self.mod_dict = mods
        self.mods = nn.ModuleDict({str(k): v for k, v in mods.items()})
        for mod in self.mods.values():
            allow = getattr(mod, "set_allow_zero_in_degree", None)
            if callable(allow):
                allow(True)  # a node may have no in-edge of one relation and still get others
        self.agg_fn = _aggregate_fn(aggregate) if isinstance(aggregate, str) else aggregate

    def _get_module(self, etype: Any) -> nn.Module:
        mod = self.mod_dict.get(etype)
        if mod is not None:
            return mod
        if isinstance(etype, tuple) and etype[1] in self.mod_dict:
            return self.mod_dict[etype[1]]
        raise KeyError(f"graphtrainer.nn.HeteroGraphConv has no layer for relation {etype}; it has "
                       f"{list(self.mod_dict)}")

    def forward(self, g: Any, inputs: Any, mod_args: Optional[Dict[str, tuple]] = None,
                mod_kwargs: Optional[Dict[str, dict]] = None) -> Dict[str, torch.Tensor]:
        """``{dst type: output}`` for the types some relation reaches."""
        if not isinstance(g, TorchHeteroBlock) and not is_dgl_graph(g):
            raise TypeError("graphtrainer.nn.HeteroGraphConv expects a DGL heterograph/block or a "
                            f"graphtrainer.nn.TorchHeteroBlock, got {type(g).__name__}")
        mod_args, mod_kwargs = mod_args or {}, mod_kwargs or {}
        outputs: Dict[str, List[torch.Tensor]] = {nt: [] for nt in g.dsttypes}
        if isinstance(inputs, tuple):
            src_inputs, dst_inputs = inputs
        elif g.is_block:
            src_inputs = inputs
            dst_inputs = {k: v[:g.number_of_dst_nodes(k)] for k, v in inputs.items()}
        else:
            src_inputs = dst_inputs = inputs
        block_like = isinstance(inputs, tuple) or g.is_block
        for stype, etype, dtype in g.canonical_etypes:
            if stype not in src_inputs or (block_like and dtype not in dst_inputs):
                continue
            rel = g[stype, etype, dtype]
            out = self._get_module((stype, etype, dtype))(
                rel, (src_inputs[stype], dst_inputs[dtype]), *mod_args.get(etype, ()), **mod_kwargs.get(etype, {}))
            outputs[dtype].append(out)
        return {nt: self.agg_fn(xs, nt) for nt, xs in outputs.items() if xs}
