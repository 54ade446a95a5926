"""The torch-block path on a GPU, run in a child process by tests/integration/test_gpu.py (so the test
process never initialises CUDA). Needs no DGL: torch blocks are built from tensors.

    python tests/helpers/nn_gpu_script.py --out DIR [--device cuda] [--fit]

Writes ``DIR/nn_gpu.json``: per layer the largest difference between its CPU and GPU
outputs/gradients; what the prefetching transfer returned; with ``--fit``, a 1-GPU fit of a
plain-torch sampled task with torch blocks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphtrainer.nn import GATConv, GraphConv, SAGEConv, TorchBlock, readout  # noqa: E402


def random_block(seed: int, num_src: int = 50, num_dst: int = 20, edges: int = 160, isolated: int = 3) -> TorchBlock:
    """A block from tensors: destinations ``< isolated`` have no in-edges."""
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(isolated, num_dst, (edges,), generator=gen).sort().values
    src = torch.randint(0, num_src, (edges,), generator=gen)
    indptr = torch.zeros(num_dst + 1, dtype=torch.long)
    indptr[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    eids = torch.randperm(edges, generator=gen)
    return TorchBlock(indptr, src, eids, num_src, num_dst,
                      srcdata={"feat": torch.randn(num_src, 6, generator=gen)},
                      dstdata={"label": torch.randint(0, 3, (num_dst,), generator=gen)})


def layer_diffs(device: torch.device) -> Dict[str, float]:
    block = random_block(0)
    layers = {"sage_mean": lambda: SAGEConv(6, 4, "mean"), "sage_gcn": lambda: SAGEConv(6, 4, "gcn"),
              "sage_pool": lambda: SAGEConv(6, 4, "pool"),
              "graphconv": lambda: GraphConv(6, 4, allow_zero_in_degree=True),
              "gat": lambda: GATConv(6, 4, 3, allow_zero_in_degree=True)}
    out: Dict[str, float] = {}
    for name, make in layers.items():
        torch.manual_seed(0)
        cpu = make()
        gpu = make().to(device)
        gpu.load_state_dict(cpu.state_dict())
        results = []
        for layer, graph in ((cpu, block), (gpu, block.to(device))):
            x = graph.srcdata["feat"].clone().requires_grad_(True)
            y = layer(graph, x)
            (y * torch.arange(y.numel(), device=y.device).reshape(y.shape).float().sin()).sum().backward()
            results.append([y.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()])
        out[name] = max(float((a - b).abs().max()) for a, b in zip(*results))
    graph = TorchBlock(block.indptr[:21], block.indices[:int(block.indptr[20])],
                       torch.arange(int(block.indptr[20])), 20, 20, is_block=False,
                       batch_num_nodes_=torch.tensor([5, 0, 15]))
    h = torch.randn(20, 3)
    out["readout_max"] = float((readout(graph.to(device), h.to(device), "max").cpu() - readout(graph, h, "max"))
                               .abs().max())
    return out


def transfer_check(device: torch.device, prefetch: bool) -> Dict[str, Any]:
    from graphtrainer.nn.transfer import BatchTransfer
    from graphtrainer.task import move_to_device

    batches = [(torch.arange(i, i + 4), [random_block(i)]) for i in range(5)]
    transfer = BatchTransfer(device, "torch", move_to_device, prefetch=prefetch)
    rows: List[Dict[str, Any]] = []
    for item in transfer.batches(batches):
        ids, (block,) = transfer.to_device(item)
        # A kernel on the compute stream reads the copy right away: it must see the whole batch.
        feat_sum = float(block.srcdata["feat"].sum())
        rows.append({"ids": ids.cpu().tolist(), "devices": sorted({str(t.device) for t in block.tensors().values()}),
                     "feat_sum": feat_sum, "type": type(block).__name__})
    expected = [float(random_block(i).srcdata["feat"].sum()) for i in range(5)]
    return {"rows": rows, "expected_sums": expected, "prefetched": transfer.streams is not None and prefetch}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--fit", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    result: Dict[str, Any] = {"layers": layer_diffs(device)}
    result["transfer"] = {str(p): transfer_check(device, p) for p in (True, False)}
    if args.fit:
        from nn_gpu_tasks import fit_plain_torch_task

        result["fit"] = fit_plain_torch_task(args.out, args.device)
    result["ok"] = all(math.isfinite(v) for v in result["layers"].values())
    Path(args.out, "nn_gpu.json").write_text(json.dumps(result))
    os.sys.stdout.flush()


if __name__ == "__main__":
    main()
