"""Tutorial 5: PyG's multi-GPU tutorial with PyG's own model code, as a GraphTask.

PyG's "multi-GPU training in pure PyTorch" tutorial (``examples/multi_gpu/distributed_sampling.py``)
trains ``torch_geometric.nn.GraphSAGE`` (2 layers, hidden 256) on Reddit with
``NeighborLoader(num_neighbors=[25, 10], batch_size=1024)``, one process per GPU started by
``mp.spawn``, wrapped in ``DistributedDataParallel``. Its step is::

    out = model(batch.x, batch.edge_index)[:batch.batch_size]
    loss = F.cross_entropy(out, batch.y[:batch.batch_size])

This script keeps that model and that step, word for word, in a :class:`graphtrainer.GraphTask`.
What PyG's loader did comes from graphtrainer: ``batch_format = "pyg"`` makes
``self.node_dataloader`` yield PyG's ``Data`` batches (``x``, ``edge_index``, ``y``,
``batch_size``, ``n_id``, ``e_id``, ``num_sampled_nodes``, ``num_sampled_edges``) with
``NeighborLoader``'s semantics, sampled by DGL. Nothing is compiled: PyG's own sampler needs
``pyg-lib`` or ``torch-sparse``, which are not on the package index; here ``pip install
graphtrainer[pyg]`` (pure Python) is all it takes.

Run it
------
Two CPU processes (the graph is Reddit-sized and synthetic, see below)::

    bash scripts/env.sh python tutorials/05_pyg_style_sage.py

On N GPUs, one rank per GPU, as PyG's tutorial runs (``Trainer(gpus=N)``; the batches are
pinned, copied and prefetched one step ahead on a side CUDA stream)::

    python tutorials/05_pyg_style_sage.py --gpus 4

Smoke test (a 20,000-node graph, batches of 256, 3 epochs; ``tests/tutorials/test_tutorial_05.py``
runs it)::

    bash scripts/env.sh python tutorials/05_pyg_style_sage.py --fast --out /tmp/t05

What to look at: the training loss falling and the validation and test accuracy (chance
is 1/41), every validation and test node scored once over the ranks. Measured output: the
smoke run's figures, which the test checks, are in ``tutorials/results/05_pyg_style_sage.json``;
no full run of the Reddit-sized graph was recorded on this project's 2-core machine.

PyG's workflow, step by step
----------------------------
* ``dataset = Reddit(path)`` and ``mp.spawn(run, ...)``: build the graph once in the parent;
  ``Trainer(num_procs=2)`` or ``Trainer(gpus=N)`` starts the ranks (forked ranks share the
  graph copy-on-write), picks a free port and the backend, and wraps the model in DDP.
* ``NeighborLoader(data, input_nodes=train_idx, num_neighbors=[25, 10], batch_size=1024)``
  with ``train_idx.split(...)[rank]``: ``self.node_dataloader(ids, [10, 25], 1024)`` with
  ``batch_format = "pyg"``. Every rank gets an even share of all ids, a new one each epoch.
  **Fanouts list the input layer first** (DGL's order), so PyG's ``num_neighbors=[25, 10]``
  (hop 1 first) is ``[10, 25]`` here. As in PyG, each node's neighbours are sampled once, at
  the hop where it first appears.
* ``batch = batch.to(rank)``: done by the trainer (``self.device`` is the rank's device).
* The loop, ``optimizer.zero_grad()``/``backward()``/``step()`` and ``dist.barrier()``: the
  trainer's. Evaluation with ``dist.all_reduce`` of per-rank mean accuracies: ``self.log``
  with the seed count, an exact mean over every node of every rank, each scored once.

Cost: PyG's model runs its first layer on every node of the sampled subgraph, the outermost
ones too, where DGL's blocks compute each layer only for the nodes the next one needs. On CPU
that is several times the work per batch (``benchmarks/arms.py pyg_vs_blocks``); on a GPU the
difference disappears into launch overhead. PyG's own remedy works here unchanged: call
``self.model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
num_sampled_edges_per_hop=batch.num_sampled_edges)`` to trim each layer.

PyG's multi-node tutorial: GCN under torchrun
---------------------------------------------
PyG's multi-node example trains ``torch_geometric.nn.GCN`` with one process per GPU on every
node, started by ``torchrun`` (or ``srun``). ``--model gcn`` swaps the model; the script stays
the same, and under torchrun the trainer starts nothing: each process is one rank of the job
(see tutorial 6 for Slurm and the files a job needs)::

    python -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr node01 --master-port 29500 tutorials/05_pyg_style_sage.py --model gcn --gpus 4

The graph: Reddit-sized, scaled to this machine
-----------------------------------------------
``graphtrainer.datasets.synthetic`` builds Reddit's node count (232,965), class count (41) and
split fractions (66/10/24 %), with 11.6M edges instead of 114.6M and 128 features instead of
602 (a shared 2-core machine with 24 GB of memory), homophilous labels and noisy class-mean
features, so neighbourhood aggregation beats the features alone. Chance is 1/41.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import GraphTask, ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.evaluation.ranking import accuracy  # noqa: E402
from tutorials.summary import write_summary  # noqa: E402

FULL = {"nodes": 232_965, "avg_degree": 50, "features": 128, "classes": 41, "epochs": 4, "batch_size": 1024}
# --fast: a small graph, and batches of 256 so that 3 epochs still make ~80 optimiser steps.
FAST = {"nodes": 20_000, "avg_degree": 20, "features": 128, "classes": 41, "epochs": 3, "batch_size": 256}


class PygReddit(GraphTask):
    """PyG's tutorial as a task: its model (GraphSAGE, or GCN with ``model="gcn"``), its step,
    fanouts [25, 10] in PyG's order, batch 1024, Adam(lr=0.001)."""

    batch_format = "pyg"  # every loader of this task yields PyG's Data; checked before ranks start

    def __init__(self, graph: Any, model: str = "graphsage", hidden: int = 256, batch_size: int = 1024,
                 lr: float = 1e-3, fanouts: Sequence[int] = (10, 25)):
        super().__init__()
        self.save_hyperparameters("model", "hidden", "batch_size", "lr", "fanouts")
        self.graph = graph
        self.model_name, self.hidden, self.batch_size, self.lr = model, hidden, batch_size, lr
        self.fanouts = list(fanouts)  # input layer first: PyG's num_neighbors=[25, 10]
        self.num_features = graph.ndata["feat"].shape[1]
        self.num_classes = int(graph.ndata["label"].max()) + 1
        self.ids = {s: graph.ndata[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}

    def configure_model(self) -> torch.nn.Module:
        from torch_geometric.nn import GCN, GraphSAGE

        if self.model_name == "gcn":
            return GCN(self.num_features, self.hidden, num_layers=2, out_channels=self.num_classes)
        return GraphSAGE(self.num_features, hidden_channels=self.hidden, num_layers=2,
                         out_channels=self.num_classes)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["train"], self.fanouts, self.batch_size, shuffle=True)

    def val_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["val"], self.fanouts, self.batch_size, shuffle=False)

    def test_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["test"], self.fanouts, self.batch_size, shuffle=False)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out = self.model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        self.log("train_loss", loss, prog_bar=True)  # weighted by batch.batch_size
        self.log("train_acc", accuracy(out, batch.y[:batch.batch_size]))
        return loss

    def _eval(self, batch: Any, prefix: str) -> None:
        out = self.model(batch.x, batch.edge_index)[:batch.batch_size]
        y = batch.y[:batch.batch_size]
        self.log(f"{prefix}_loss", F.cross_entropy(out, y))
        self.log(f"{prefix}_acc", accuracy(out, y))
        self.log(f"{prefix}_nodes_scored", batch.batch_size, reduce_fx="sum")  # a total over all ranks

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2, help="CPU ranks (without --gpus)")
    parser.add_argument("--gpus", type=int, default=None, help="one rank per GPU, as PyG's tutorial")
    parser.add_argument("--model", choices=("graphsage", "gcn"), default="graphsage")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"default {FULL['epochs']} ({FAST['epochs']} with --fast)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/tutorial05", help="runs, checkpoints and summary.json")
    parser.add_argument("--fast", action="store_true",
                        help=f"a {FAST['nodes']:,}-node graph and {FAST['epochs']} epochs: a smoke test")
    args = parser.parse_args(argv)
    size = FAST if args.fast else FULL

    from graphtrainer.datasets import synthetic

    started = time.time()
    graph = synthetic(size["nodes"], size["avg_degree"], size["features"], size["classes"],
                      seed=args.seed, train_frac=0.66, val_frac=0.10)
    n_val, n_test = (int(graph.ndata[f"{s}_mask"].sum()) for s in ("val", "test"))
    print(f"synthetic Reddit-sized graph: {graph.num_nodes():,} nodes, {graph.num_edges():,} edges", flush=True)

    task = PygReddit(graph, model=args.model, batch_size=size["batch_size"])
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    where = {"gpus": args.gpus} if args.gpus else {"num_procs": args.num_procs}
    trainer = Trainer(max_epochs=args.epochs or size["epochs"], seed=args.seed, default_root_dir=Path(args.out),
                      callbacks=[ckpt, PrintMetrics(["train_loss", "train_acc", "val_acc"], elapsed=True)],
                      progress_bar=False, **where)
    trainer.fit(task)
    test = trainer.test(task, ckpt_path="best")
    if trainer.rank != 0:  # under torchrun every process runs this; rank 0 writes the summary
        return test
    first, last = trainer.history[0], trainer.history[-1]
    summary = {
        "tutorial": "05_pyg_style_sage", "fast": args.fast, "model": args.model, "num_procs": args.num_procs,
        "gpus": args.gpus, "model_class": task.module.__class__.__module__ + "." + task.module.__class__.__name__,
        "fanouts": task.fanouts, "hidden": task.hidden, "num_classes": task.num_classes, "epochs": len(trainer.history),
        "train_loss_first": first["train_loss"], "train_loss_last": last["train_loss"], "val_acc_last": last["val_acc"],
        "val_nodes_scored": int(round(last["val_nodes_scored"])), "val_nodes": n_val,
        "test_acc": test["test_acc"], "test_nodes_scored": int(round(test["test_nodes_scored"])),
        "test_nodes": n_test, "checkpoint": ckpt.best_model_path, "log_dir": str(trainer.log_dir),
        "seconds": round(time.time() - started, 1),
    }
    print(f"test_acc {test['test_acc']:.4f} over {summary['test_nodes_scored']:,} of {n_test:,} test nodes "
          f"(chance {1 / task.num_classes:.4f})")
    print(f"summary written to {write_summary(args.out, summary)}", flush=True)
    return summary


if __name__ == "__main__":
    main()
