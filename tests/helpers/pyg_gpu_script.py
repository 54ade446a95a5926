"""PyG batches on a GPU, run in a child process by tests/integration/test_pyg_gpu.py (and on a
lent GPU machine, which has torch-geometric but no DGL: blocks are built with torch ops).

    python tests/helpers/pyg_gpu_script.py --out DIR [--device cuda] [--fit] [--bench]

Writes ``DIR/pyg_gpu.json``: the PyG batch made on the device from device blocks against the
one made on the CPU; PyG's GraphSAGE on the device against the CPU; what the prefetching
transfer returned; with ``--fit``, a 1-device fit of PyG's GraphSAGE on PyG batches; with
``--bench``, seeds/s of PyG's GraphSAGE on PyG batches (as PyG's tutorial calls it, and trimmed
per layer) against graphtrainer.models.SAGE on the same torch blocks (training steps only: both
come from the same sampled blocks; the PyG batch's conversion is counted).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphtrainer.nn.pyg import to_pyg  # noqa: E402
from nn_gpu_tasks import TorchSageTask, TorchSampledBatches, random_csc, sample_block  # noqa: E402


def sampled(n: int, degree: int, seeds: int, layers: int, feat: int, seed: int, keep: float = 0.6) -> List[Any]:
    """One batch's blocks (DGL's layout, torch ops only) with features and labels."""
    indptr, indices = random_csc(n, degree, seed)
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randperm(n, generator=gen)[:seeds]
    blocks: List[Any] = []
    for _ in range(layers):
        block = sample_block(indptr, indices, dst, keep, gen)
        block.edata["_ID"] = torch.randperm(block.num_edges(), generator=gen)  # stand-in graph edge ids
        blocks.insert(0, block)
        dst = block.srcdata["_ID"]
    blocks[0].srcdata["feat"] = torch.randn(blocks[0].num_src, feat, generator=gen)
    blocks[-1].dstdata["label"] = torch.randint(0, 5, (blocks[-1].num_dst,), generator=gen)
    return blocks


def same_batch(a: Any, b: Any) -> bool:
    if sorted(a.keys()) != sorted(b.keys()):
        return False
    return all(torch.equal(a[k].cpu(), b[k].cpu()) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
               for k in a.keys())


def conversion_and_model(device: torch.device) -> Dict[str, Any]:
    from torch_geometric.nn import GraphSAGE

    out: Dict[str, Any] = {}
    for layers in (2, 3):
        blocks = sampled(2000, 8, 64, layers, 6, seed=layers)
        on_cpu = to_pyg(blocks)
        on_device = to_pyg([b.to(device) for b in blocks])  # a device sampler's blocks
        out[f"same_batch_{layers}"] = same_batch(on_cpu, on_device)
        out[f"device_{layers}"] = str(on_device.edge_index.device)
        torch.manual_seed(0)
        model = GraphSAGE(6, 16, num_layers=layers, out_channels=5).eval()
        with torch.no_grad():
            want = model(on_cpu.x, on_cpu.edge_index)[:on_cpu.batch_size]
            got = model.to(device)(on_device.x, on_device.edge_index)[:on_device.batch_size]
        out[f"model_diff_{layers}"] = float((got.cpu() - want).abs().max())
    return out


def transfer_check(device: torch.device) -> Dict[str, Any]:
    from graphtrainer.nn.transfer import BatchTransfer
    from graphtrainer.task import move_to_device

    batches = [to_pyg(sampled(1000, 6, 32, 2, 4, seed=10 + i)) for i in range(5)]
    expected = [float(b.x.sum()) for b in batches]
    transfer = BatchTransfer(device, "auto", move_to_device)
    rows = []
    for item in transfer.batches(batches):
        data = transfer.to_device(item)
        rows.append({"devices": sorted({str(v.device) for _, v in data if isinstance(v, torch.Tensor)}),
                     "x_sum": float(data.x.sum()), "type": type(data).__name__})
    return {"rows": rows, "expected_sums": expected, "prefetched": transfer.streams is not None}


class PygBatches(TorchSampledBatches):
    def __iter__(self):
        for batch in super().__iter__():
            yield to_pyg(batch)


class PygSageTask(TorchSageTask):
    """TorchSageTask with PyG's GraphSAGE on PyG batches (the tutorial's step)."""

    def configure_model(self) -> torch.nn.Module:
        from torch_geometric.nn import GraphSAGE

        return GraphSAGE(8, 32, num_layers=self.layers, out_channels=3)

    def train_dataloader(self) -> Any:
        return PygBatches(self, torch.arange(self.n * 3 // 4), shuffle=True)

    def val_dataloader(self) -> Any:
        return PygBatches(self, torch.arange(self.n * 3 // 4, self.n), shuffle=False)

    def _loss_acc(self, batch: Any) -> Any:
        self.seen["devices"].append(str(batch.x.device))
        self.seen["types"].append(type(batch).__name__)
        logits = self.model(batch.x, batch.edge_index)[:batch.batch_size]
        labels = batch.y[:batch.batch_size]
        return F.cross_entropy(logits, labels), (logits.argmax(1) == labels).float().mean()

    def on_train_epoch_end(self) -> None:
        self.log("on_gpu", float(all(d.startswith("cuda") for d in self.seen["devices"])), batch_size=1)
        self.log("pyg_batches", float(all(t == "Data" for t in self.seen["types"])), batch_size=1)


def fit(out: str, device: str) -> Dict[str, Any]:
    from graphtrainer import Trainer

    task = PygSageTask()
    where = {"gpus": 1} if device.startswith("cuda") else {"num_procs": 1}
    trainer = Trainer(max_epochs=4, seed=0, progress_bar=False, logger=False, default_root_dir=f"{out}/runs",
                      enable_model_summary=False, **where)
    trainer.fit(task)
    return {"history": trainer.history}


def bench(device: torch.device, rounds: int = 5, steps: int = 8) -> Dict[str, Any]:
    """Seeds/s of one training step (forward, backward, Adam) of each model, interleaved."""
    from torch_geometric.nn import GraphSAGE, SAGEConv

    from graphtrainer.models import SAGE

    batches = [[b.to(device) for b in sampled(200_000, 20, 1024, 2, 128, seed=100 + i, keep=0.5)]
               for i in range(steps)]
    models = {"pyg_graphsage": GraphSAGE(128, 256, num_layers=2, out_channels=41).to(device),
              "pyg_graphsage_trimmed": GraphSAGE(128, 256, num_layers=2, out_channels=41).to(device),
              "pyg_sageconv_on_blocks": torch.nn.ModuleList([SAGEConv(128, 256), SAGEConv(256, 41)]).to(device),
              "gt_sage_blocks": SAGE(128, 256, 41, num_layers=2, dropout=0.0).to(device)}
    optims = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in models.items()}

    def step(name: str, blocks: List[Any]) -> None:
        if name.startswith("pyg_graphsage"):
            data = to_pyg(blocks)  # the conversion counts: it is part of this format's cost
            trim = {"num_sampled_nodes_per_hop": data.num_sampled_nodes,
                    "num_sampled_edges_per_hop": data.num_sampled_edges} if name.endswith("trimmed") else {}
            logits = models[name](data.x, data.edge_index, **trim)[:data.batch_size]
            labels = data.y[:data.batch_size]
        elif name == "pyg_sageconv_on_blocks":  # PyG's layers, DGL's block style
            h = blocks[0].srcdata["feat"]
            for i, (conv, block) in enumerate(zip(models[name], blocks)):
                h = conv((h, h[:block.num_dst]), block.edge_index)
                h = h.relu() if i == 0 else h
            logits, labels = h, blocks[-1].dstdata["label"]
        else:
            logits = models[name](blocks, blocks[0].srcdata["feat"])
            labels = blocks[-1].dstdata["label"]
        loss = F.cross_entropy(logits, labels)
        optims[name].zero_grad()
        loss.backward()
        optims[name].step()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: Dict[str, List[float]] = {k: [] for k in models}
    for r in range(rounds + 1):  # round 0 warms up
        for name in (models if r % 2 else reversed(list(models))):
            sync()
            started = time.perf_counter()
            for blocks in batches:
                step(name, blocks)
            sync()
            if r:
                times[name].append(time.perf_counter() - started)
    seeds = 1024 * steps
    result = {k: {"seeds_per_s": seeds / (sorted(v)[len(v) // 2]), "round_seconds": v} for k, v in times.items()}
    for name in ("pyg_graphsage", "pyg_graphsage_trimmed", "pyg_sageconv_on_blocks"):  # time per seed, PyG's over the blocks'
        result[f"ratio_{name}_over_blocks"] = result["gt_sage_blocks"]["seeds_per_s"] / result[name]["seeds_per_s"]
    result["edges_per_batch"] = sum(b.num_edges() for b in batches[0])
    result["input_nodes_per_batch"] = batches[0][0].num_src
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    result: Dict[str, Any] = {"torch": torch.__version__, "conversion": conversion_and_model(device),
                              "transfer": transfer_check(device)}
    import torch_geometric

    result["torch_geometric"] = torch_geometric.__version__
    if args.fit:
        result["fit"] = fit(args.out, args.device)
    if args.bench:
        result["bench"] = bench(device)
    Path(args.out, "pyg_gpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result)[:3000], flush=True)


if __name__ == "__main__":
    main()
