"""Layer-wise full-graph inference: every node's output with full neighbourhoods.

Sampled evaluation scores a node with a random subset of its neighbours: a noisy metric,
not the one papers report. :func:`layerwise` computes layer ``l`` for every node from layer
``l - 1``'s outputs of its full neighbourhood (as DGL's multi-GPU examples), one layer at a
time, so no ``L``-hop neighbourhood has to fit in memory.

Each rank computes a contiguous range of each node type in batches of ``batch_size``
destination nodes and writes its rows into one output per layer shared by all ranks (a
``/dev/shm`` file each maps): no copy per rank, no collective carrying rows.

Memory per layer (``N`` nodes, ``D`` the widest output, float32): ``2·N·D·4`` bytes for the
machine (previous and current layer), plus per rank one batch's block and source rows,
``batch_size · (average in-degree + 1) · D_in · 4`` bytes at most. 1M nodes, 10M edges,
SAGE 64 -> 64 -> 8, 2 ranks: 275 MB shared, 70-120 MB private per rank, 10-21 s
(``benchmarks/evaluation.py layerwise``).

The model needs ``layers`` (one entry per layer) and ``inference_layer(i, block, h)``, applying
layer ``i`` and what follows it in ``forward`` to ``h``, ``block``'s source inputs (as
:class:`graphtrainer.models.SAGE` and :class:`graphtrainer.models.HeteroSAGE`).
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import nn

from .. import comm as gdist
from .. import heartbeat
from ..nn.convert import to_torch_graph
from ..nn.transfer import dgl_runs_on

Features = Union[torch.Tensor, Dict[str, torch.Tensor]]

#: Where CPU layer outputs are shared between ranks.
SHM_DIR = "/dev/shm"


def check_layerwise_model(model: Any) -> Tuple[Callable[..., Any], int]:
    """``(inference_layer, number of layers)`` of ``model``, or a ``TypeError`` saying what to add."""
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    layer_fn = getattr(module, "inference_layer", None)
    layers = getattr(module, "layers", None)
    if not callable(layer_fn) or layers is None or not hasattr(layers, "__len__"):
        raise TypeError(
            f"layerwise inference needs per-layer access, which {type(module).__name__} does not give: "
            "add a `layers` attribute (an nn.ModuleList, one entry per GNN layer) and a method "
            "`inference_layer(self, i, block, h)` that applies layer i and what follows it in forward "
            "(activation, normalisation) to h, the inputs of block's source nodes. "
            "graphtrainer.models.SAGE shows one.")
    return layer_fn, len(layers)


def node_range(n: int, rank: int, world: int) -> Tuple[int, int]:
    """Rank ``rank``'s contiguous share ``[start, end)`` of ``n`` nodes (sizes differ by at most one)."""
    return rank * n // world, (rank + 1) * n // world


@torch.no_grad()
def layerwise(model: nn.Module, graph: Any, features: Optional[Features] = None, *, batch_size: int = 1024,
              device: Optional[torch.device] = None, feat_key: str = "feat") -> Features:
    """Every node's output of ``model`` on ``graph`` with full neighbourhoods, layer by layer.

    Must be called on all processes (one barrier per layer), outside ``training_step`` (e.g.
    ``on_validation_epoch_end``, ``predict_step``, after ``fit``). ``features`` default to
    ``graph.ndata[feat_key]`` (``{ntype: tensor}`` on a heterograph); ``model`` is
    ``task.module`` or its DDP wrapper, in eval mode for the call. Returns ``[num_nodes, out]``
    (or ``{ntype: ...}``) on the CPU, the same on every rank.
    """
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    layer_fn, num_layers = check_layerwise_model(model)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    hetero = len(graph.ntypes) > 1
    h = _features(graph, features, feat_key, hetero)
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rank, world = gdist.get_rank(), gdist.get_world_size()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    was_training = module.training
    module.eval()
    try:
        for layer in range(num_layers):
            h = _one_layer(layer_fn, layer, graph, h, sampler, int(batch_size), device, rank, world)
    finally:
        module.train(was_training)
    return h if hetero else h[graph.ntypes[0]]


def _features(graph: Any, features: Optional[Features], feat_key: str, hetero: bool) -> Dict[str, torch.Tensor]:
    if features is None:
        if hetero:
            features = {nt: graph.nodes[nt].data[feat_key] for nt in graph.ntypes
                        if feat_key in graph.nodes[nt].data}
            if not features:
                raise ValueError(f"layerwise: no node type of the graph has ndata[{feat_key!r}]; pass features=")
        else:
            if feat_key not in graph.ndata:
                raise ValueError(f"layerwise: graph.ndata has no {feat_key!r}; pass features= or feat_key=")
            features = graph.ndata[feat_key]
    if isinstance(features, torch.Tensor):
        if hetero:
            raise ValueError(f"layerwise: the graph has node types {list(graph.ntypes)}; pass features as "
                             "{ntype: tensor}")
        features = {graph.ntypes[0]: features}  # "_N", or the one type's own name
    for nt, x in features.items():
        if nt not in graph.ntypes:
            raise ValueError(f"layerwise: unknown node type {nt!r}; the graph has {list(graph.ntypes)}")
        if x.shape[0] != graph.num_nodes(nt):
            raise ValueError(f"layerwise: features of {nt!r} have {x.shape[0]} rows, the graph has "
                             f"{graph.num_nodes(nt)} such nodes")
    return dict(features)


def _one_layer(layer_fn: Callable[..., Any], layer: int, graph: Any, h: Dict[str, torch.Tensor], sampler: Any,
               batch_size: int, device: torch.device, rank: int, world: int) -> Dict[str, torch.Tensor]:
    shapes = _probe(layer_fn, layer, graph, h, sampler, device)
    shared = gdist.is_distributed() and _one_machine()
    out = _shared_outputs(graph, shapes)
    batch_idx = 0
    for nt in shapes:
        start, end = node_range(graph.num_nodes(nt), rank, world)
        for lo in range(start, end, batch_size):
            heartbeat.beat(f"layerwise inference, layer {layer}", batch_idx)
            seeds = torch.arange(lo, min(lo + batch_size, end), dtype=graph.idtype)  # DGL wants the graph's
            rows = _apply(layer_fn, layer, graph, h, sampler, {nt: seeds}, device)
            if nt not in rows:
                last = lo + seeds.numel() - 1
                raise ValueError(f"layerwise: layer {layer} gave no output for {nt!r} nodes {lo}..{last}"
                                 " (none of them has an in-edge): make inference_layer return rows for every "
                                 "destination node, e.g. a self-loop relation or a zero row")
            out[nt][lo:lo + seeds.numel()] = rows[nt].to("cpu", out[nt].dtype)
            batch_idx += 1
    if not gdist.is_distributed():
        return out
    if shared:
        gdist.barrier()  # every rank's rows are written before anyone reads the layer
        return out
    # Several machines: the ranges are contiguous in rank order, so a gather rebuilds the layer.
    return {nt: gdist.all_gather_tensor(out[nt][slice(*node_range(out[nt].shape[0], rank, world))])
            for nt in shapes}


def _apply(layer_fn: Callable[..., Any], layer: int, graph: Any, h: Dict[str, torch.Tensor], sampler: Any,
           seeds: Dict[str, torch.Tensor], device: torch.device) -> Dict[str, torch.Tensor]:
    """Layer ``layer`` for ``seeds`` from their full in-neighbourhood."""
    hetero = len(graph.ntypes) > 1
    only = graph.ntypes[0]
    _, _, blocks = sampler.sample_blocks(graph, seeds if hetero else seeds[only])
    block = _to_device(blocks[0], device)
    if hetero:
        src = {nt: ids for nt, ids in block.srcdata["_ID"].items()} if isinstance(block.srcdata["_ID"], dict) \
            else {block.srctypes[0]: block.srcdata["_ID"]}
        x = {nt: h[nt][ids.cpu()].to(device) for nt, ids in src.items() if nt in h}
    else:
        x = h[only][block.srcdata["_ID"].cpu()].to(device)
    y = layer_fn(layer, block, x)
    if isinstance(y, torch.Tensor):
        if hetero:
            (nt,) = [t for t, s in seeds.items() if s.numel()]
            return {nt: y}
        return {only: y}
    return y


def _to_device(block: Any, device: torch.device) -> Any:
    """The block on ``device``: DGL's where DGL runs there, else a torch-only block."""
    return block.to(device) if dgl_runs_on(device) else to_torch_graph(block).to(device)


def _probe(layer_fn: Callable[..., Any], layer: int, graph: Any, h: Dict[str, torch.Tensor], sampler: Any,
           device: torch.device) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Output row shape and dtype per node type, probed on each type's node with the most
    in-edges (the same on every rank; types without in-edges give none)."""
    shapes: Dict[str, Tuple[Tuple[int, ...], torch.dtype]] = {}
    for nt in graph.ntypes:
        if graph.num_nodes(nt) == 0:
            continue
        into = [et for et in graph.canonical_etypes if et[2] == nt]
        if len(graph.ntypes) > 1 and not into:
            continue
        degree = sum(graph.in_degrees(etype=et) for et in into)
        probe = int(torch.as_tensor(degree).argmax())
        rows = _apply(layer_fn, layer, graph, h, sampler, {nt: torch.tensor([probe], dtype=graph.idtype)}, device)
        if nt in rows:
            shapes[nt] = (tuple(rows[nt].shape[1:]), rows[nt].dtype)
    if not shapes:
        raise ValueError(f"layerwise: layer {layer} produced no output for any node type")
    return shapes


def _shared_outputs(graph: Any, shapes: Dict[str, Tuple[Tuple[int, ...], torch.dtype]]) -> Dict[str, torch.Tensor]:
    """One output tensor per node type: plain in one process, else one ``/dev/shm`` file per type
    mapped by every rank (all on this machine)."""
    if not gdist.is_distributed() or not _one_machine():
        return {nt: torch.empty((graph.num_nodes(nt), *row), dtype=dtype) for nt, (row, dtype) in shapes.items()}
    name = gdist.broadcast_object(f"graphtrainer-layerwise-{os.getpid()}-{uuid.uuid4().hex}"
                                  if gdist.get_rank() == 0 else None)
    paths = {nt: os.path.join(SHM_DIR, f"{name}-{k}") for k, nt in enumerate(shapes)}
    sizes = {nt: graph.num_nodes(nt) * torch.Size(row).numel() for nt, (row, _) in shapes.items()}
    if gdist.get_rank() == 0:
        for nt, (_, dtype) in shapes.items():
            with open(paths[nt], "wb") as f:
                f.truncate(sizes[nt] * torch.empty((), dtype=dtype).element_size())
    gdist.barrier()
    try:
        out = {nt: torch.from_file(paths[nt], shared=True, size=sizes[nt], dtype=dtype).view(-1, *row)
               for nt, (row, dtype) in shapes.items()}
    finally:
        gdist.barrier()  # every rank has mapped the files (or failed): the names can go
        if gdist.get_rank() == 0:
            for path in paths.values():
                if os.path.exists(path):
                    os.unlink(path)
    return out


_SAME_MACHINE: Dict[int, bool] = {}


def _one_machine() -> bool:
    """Whether every rank runs on this machine (checked once per process group size)."""
    import socket

    world = gdist.get_world_size()
    if world not in _SAME_MACHINE:
        _SAME_MACHINE[world] = len(set(gdist.all_gather_object(socket.gethostname()))) == 1
    return _SAME_MACHINE[world]
