"""Tutorial 5: PyG's "multi-GPU training in pure PyTorch" (GraphSAGE on Reddit), ported.

PyG's tutorial walks through ``examples/multi_gpu/distributed_sampling.py``: a two-layer
GraphSAGE (``SAGEConv``, hidden 256) trained on Reddit with ``NeighborLoader``
(``num_neighbors=[25, 10]``, batch size 1024), one process per GPU started by
``mp.spawn``, and ``DistributedDataParallel``. This script runs the same model,
fanouts, batch size and optimiser as a :class:`graphtrainer.GraphTask`, on CPU
processes, on a Reddit-sized synthetic graph. PyG is not needed (and not installed):
the model is DGL's ``SAGEConv``, which computes the same thing as PyG's (mean of the
sampled neighbours through one linear map, plus a linear map of the node itself).

Run it
------
Full settings (2 CPU processes, 4 epochs, about 2 minutes here)::

    bash scripts/env.sh python tutorials/05_pyg_style_sage.py

Smoke test (a 20,000-node graph, batches of 256, 3 epochs; ``tests/tutorials/test_tutorial_05.py`` runs it)::

    bash scripts/env.sh python tutorials/05_pyg_style_sage.py --fast --out /tmp/t05

Output of the full run, measured on 2 CPU cores (torch 2.2.1, dgl 2.1.0)::

    synthetic Reddit-sized graph: 232,965 nodes, 11,648,250 edges (Reddit: 114,615,892), 128 features (Reddit: 602), 41 classes; train/val/test 153,757/23,296/55,912; built in 3.3 s
    name     type              params
    layers   ModuleList        86,825
    dropout  Dropout                0
    SAGE: 86,825 trainable of 86,825 parameters (0.3 MB in float32)
    epoch   0  train_loss 4.1606  train_acc 0.0950  val_acc 0.4962  (31 s)
    epoch   1  train_loss 2.0702  train_acc 0.4537  val_acc 0.9006  (58 s)
    epoch   2  train_loss 0.9012  train_acc 0.7936  val_acc 0.9740  (75 s)
    epoch   3  train_loss 0.4155  train_acc 0.9181  val_acc 0.9879  (92 s)
    [graphtrainer] ckpt_path='best': using runs/tutorial05/version_0/checkpoints/epoch=3-val_acc=0.9879.ckpt
    val: 23,296 of 23,296 nodes scored, each once; best checkpoint runs/tutorial05/version_0/checkpoints/epoch=3-val_acc=0.9879.ckpt (val_acc 0.9879)
    test_acc 0.9880 over 55,912 of 55,912 test nodes (chance 0.0244)
    summary written to runs/tutorial05/summary.json (99.6 s)
    (wall time 1m42.581s; the 2 cores were shared with other jobs)

Training, validation and test repeat exactly from run to run: the test evaluation
samples [25, 10] neighbours like PyG's, and each batch's sampling is seeded from (seed,
rank, epoch, batch), so a second run of the same command printed the same losses,
accuracies and ``test_acc`` 0.9880.

The graph: Reddit-sized, scaled to this machine
-----------------------------------------------
Reddit has 232,965 nodes, 114,615,892 edges (mean degree 492), 602 features and 41
classes, split 153,431 / 23,831 / 55,703 (66 / 10 / 24 %). ``graphtrainer.datasets.synthetic``
builds a graph with the same node count, class count and split fractions, and two things
scaled down, each for a measured reason:

* **Edges: 114.6M -> 11.6M (mean degree 50).** Building the graph with all its sparse
  formats peaked at 1.2 GB for 11.6M edges; Reddit's edge count would need about ten
  times that, on a machine whose 24 GB four people share. The per-batch work does not
  depend on the degree once it exceeds the fanouts (each seed keeps at most 25, then 10,
  neighbours), so a mean degree of 50 keeps the sampling regime of Reddit: most nodes
  have more neighbours than the fanout, and a batch of 1024 seeds still reaches
  ~140,000 input nodes through ~265,000 sampled edges.
* **Features: 602 -> 128.** With 602 inputs and 256 hidden units the first ``SAGEConv``
  transforms every one of those ~140,000 input nodes before aggregating (602 > 256), and
  one training step took 1.8 s on one core; with 128 features it aggregates first and a
  step took 0.16 s (single-threaded, measured alone). An epoch is 75 steps per rank:
  2.3 minutes with 602 features, about 12 s with 128.

The synthetic graph is learnable like Reddit is: labels are homophilous (75 % of edges
join nodes of one class) and features are noisy class means, so neighbourhood
aggregation beats the features alone. Chance is 1/41 = 0.024. It is easier than Reddit:
with 75 % of the sampled neighbours in the node's own class the model reaches 0.99 in 4
epochs, where GraphSAGE gets about 0.95 on the real Reddit (Hamilton et al., 2017).

PyG's workflow, step by step, and what replaces each step
---------------------------------------------------------
The PyG script (abridged; numbers refer to the comments in the code below)::

    dataset = Reddit(path)                                          # (1) load in parent
    mp.spawn(run, args=(world_size, dataset), nprocs=world_size)    # (2) launch
    def run(rank, world_size, dataset):
        os.environ['MASTER_ADDR'] = 'localhost'                     # (3) rendezvous on a
        os.environ['MASTER_PORT'] = '12355'                         #     fixed port
        dist.init_process_group('nccl', rank=rank, world_size=world_size)
        data = dataset[0].to(rank, 'x', 'y')                        # (4) features to GPU
        train_idx = data.train_mask.nonzero().view(-1)              # (5) per-rank split
        train_idx = train_idx.split(train_idx.size(0) // world_size)[rank]
        train_loader = NeighborLoader(data, input_nodes=train_idx,  # (6) sampler + loader
            num_neighbors=[25, 10], shuffle=True, drop_last=True,
            batch_size=1024, num_workers=4, persistent_workers=True)
        val_loader = NeighborLoader(..., val_idx, drop_last=True)   #     same for val/test
        model = DDP(SAGE(num_features, 256, num_classes).to(rank),  # (7) model + DDP
                    device_ids=[rank])
        optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
        for epoch in range(1, 21):                                  # (8) training loop
            for batch in train_loader:
                out = model(batch.x, batch.edge_index)[:batch.batch_size]
                loss = F.cross_entropy(out, batch.y[:batch.batch_size])
                ...backward, step...
            dist.barrier()
            if epoch % 5 == 0:                                      # (9) evaluation:
                acc = eval(val_loader, model)   # mean of per-batch accuracies
                dist.all_reduce(acc); acc /= world_size   # mean of per-rank means
        dist.destroy_process_group()                                # (10) teardown

With graphtrainer: (2), (3), (7)'s DDP wrapping, (8)'s loop and (10) are
``Trainer(num_procs=2).fit(task)``; (4) is ``transfer_batch_to_device`` (and the graph
is shared copy-on-write by the forked ranks, not pickled to each as ``mp.spawn``
does); (5) and (6) are one ``self.node_dataloader(ids, [25, 10], 1024)``; (9) is
``self.log(..., batch_size=n)`` (and ``reduce_fx="sum"`` for the count of scored
nodes). ``ModelCheckpoint`` adds what the PyG script lacks:
a best checkpoint, then ``trainer.test(task, ckpt_path="best")``.

Differences that change numbers, not just lines:

* **Every node trained on, a new split each epoch.** ``idx.split(n // world_size)``
  makes ``world_size + 1`` chunks when ``world_size`` does not divide ``n``; the last
  one (``n % world_size`` nodes) goes to nobody. Each rank keeps the same chunk every
  epoch, and ``drop_last=True`` drops up to 1023 more nodes per rank and epoch.
  ``node_dataloader`` permutes all ids with ``(seed, epoch)`` identically on every rank
  and deals each rank an even share, a different one every epoch.
* **Exact evaluation.** The PyG loop averages per-batch accuracies (a short last batch
  counts as much as a full one), then per-rank means, and its evaluation loaders also
  ``drop_last``: up to 1023 validation nodes per rank are never scored. Here each
  validation/test node is scored exactly once across the ranks and the accuracy is the
  exact fraction (sums of correct and of counts, reduced in float64). The script counts
  the scored nodes to show it.
* (In the version of the PyG example we read, ``test_idx`` is built from ``val_mask``,
  so its "Test" figure is a second validation figure; here the test split is separate.)

PyG's first layer runs on the whole sampled subgraph and slices the seeds off at the
end (``[:batch.batch_size]``); DGL's blocks compute only what each layer needs. Both
give one output row per seed.
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
from graphtrainer.ranking import accuracy  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402
from tutorials.summary import write_summary  # noqa: E402

# Reddit's shape, and what this script uses at full settings (see the docstring).
REDDIT = {"nodes": 232_965, "edges": 114_615_892, "features": 602, "classes": 41}
FULL = {"nodes": 232_965, "avg_degree": 50, "features": 128, "classes": 41, "epochs": 4, "batch_size": 1024}
# --fast: a small graph, and batches of 256 so that 3 epochs still make ~80 optimiser steps.
FAST = {"nodes": 20_000, "avg_degree": 20, "features": 128, "classes": 41, "epochs": 3, "batch_size": 256}


class RedditSAGE(GraphTask):
    """The PyG example's model and loop as a task: SAGE(in, 256, classes), fanouts [25, 10],
    batch 1024, Adam(lr=0.001), dropout 0.5 after the first layer."""

    def __init__(self, graph: Any, fanouts: Sequence[int] = (25, 10), hidden: int = 256,
                 batch_size: int = 1024, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters("fanouts", "hidden", "batch_size", "lr")
        self.graph = graph                          # shared by the forked ranks, never copied
        self.fanouts, self.hidden, self.batch_size, self.lr = list(fanouts), hidden, batch_size, lr
        self.num_classes = int(graph.ndata["label"].max()) + 1
        # (5) the whole id set; the trainer gives each rank its share, anew each epoch.
        self.ids = {s: graph.ndata[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}

    # (7) built inside each rank; the trainer wraps it in DDP.
    def configure_model(self) -> torch.nn.Module:
        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, self.num_classes,
                    num_layers=len(self.fanouts), dropout=0.5)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    # (5) + (6): NeighborLoader(input_nodes=..., num_neighbors=[25, 10], batch_size=1024).
    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["train"], self.fanouts, self.batch_size, shuffle=True)

    # Evaluation samples [25, 10] like the PyG example, but scores every node once.
    def val_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["val"], self.fanouts, self.batch_size, shuffle=False)

    def test_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["test"], self.fanouts, self.batch_size, shuffle=False)

    # (8) one step; no zero_grad/backward/step/barrier: the trainer does them.
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, seeds, blocks = batch
        logits = self.model(blocks, blocks[0].srcdata["feat"])
        labels = blocks[-1].dstdata["label"]
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss, batch_size=seeds.numel(), prog_bar=True)
        self.log("train_acc", accuracy(logits, labels), batch_size=seeds.numel())
        return loss

    # (9) exact: weighted by the batch's seed count, summed over all batches of all ranks.
    def _eval(self, batch: Any, prefix: str) -> None:
        _, seeds, blocks = batch
        logits = self.model(blocks, blocks[0].srcdata["feat"])
        labels = blocks[-1].dstdata["label"]
        n = seeds.numel()
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels), batch_size=n)
        self.log(f"{prefix}_acc", accuracy(logits, labels), batch_size=n)
        # A total, not a mean: how many nodes all ranks scored (each id once).
        self.log(f"{prefix}_nodes_scored", n, reduce_fx="sum")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"default {FULL['epochs']} ({FAST['epochs']} with --fast)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/tutorial05", help="runs, checkpoints and summary.json")
    parser.add_argument("--root-dir", default=None, help="run folders and checkpoints (default: --out)")
    parser.add_argument("--fast", action="store_true",
                        help=f"a {FAST['nodes']:,}-node graph and {FAST['epochs']} epochs: a smoke test")
    args = parser.parse_args(argv)
    size = FAST if args.fast else FULL
    epochs = args.epochs or size["epochs"]

    from graphtrainer.datasets import synthetic

    started = time.time()
    # (1) The dataset, built once in the parent. Reddit's split is 66 / 10 / 24 %.
    graph = synthetic(size["nodes"], size["avg_degree"], size["features"], size["classes"],
                      seed=args.seed, train_frac=0.66, val_frac=0.10)
    n_train, n_val, n_test = (int(graph.ndata[f"{s}_mask"].sum()) for s in ("train", "val", "test"))
    print(f"synthetic Reddit-sized graph: {graph.num_nodes():,} nodes, {graph.num_edges():,} edges "
          f"(Reddit: {REDDIT['edges']:,}), {size['features']} features (Reddit: {REDDIT['features']}), "
          f"{size['classes']} classes; train/val/test {n_train:,}/{n_val:,}/{n_test:,}; "
          f"built in {time.time() - started:.1f} s", flush=True)

    task = RedditSAGE(graph, fanouts=[25, 10], hidden=256, batch_size=size["batch_size"], lr=1e-3)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    # Like the PyG script's `if rank == 0: print`, with exact epoch means instead of the
    # last batch's loss, and the seconds since this line (the launch included).
    show = PrintMetrics(["train_loss", "train_acc", "val_acc"], elapsed=True)
    trainer = Trainer(num_procs=args.num_procs, max_epochs=epochs, seed=args.seed,
                      default_root_dir=Path(args.root_dir or args.out), callbacks=[ckpt, show],
                      progress_bar=False)
    trainer.fit(task)
    fit_seconds = time.time() - started
    test = trainer.test(task, ckpt_path="best")

    last = trainer.history[-1]
    summary = {
        "tutorial": "05_pyg_style_sage", "fast": args.fast, "num_procs": args.num_procs,
        "nodes": graph.num_nodes(), "edges": graph.num_edges(), "features": size["features"],
        "num_classes": task.num_classes, "epochs": trainer.current_epoch, "fanouts": task.fanouts,
        "hidden": task.hidden, "batch_size": task.batch_size,
        "train_loss_first": trainer.history[0]["train_loss"], "train_loss_last": last["train_loss"],
        "train_acc_last": last["train_acc"], "val_acc_last": last["val_acc"],
        "val_nodes_scored": int(round(last["val_nodes_scored"])), "val_nodes": n_val,
        "best_val_acc": ckpt.best_model_score, "test_acc": test["test_acc"], "test_loss": test["test_loss"],
        "test_nodes_scored": int(round(test["test_nodes_scored"])), "test_nodes": n_test,
        "checkpoint": ckpt.best_model_path, "log_dir": str(trainer.log_dir),
        "seconds_to_end_of_fit": round(fit_seconds, 1), "seconds": round(time.time() - started, 1),
    }
    print(f"val: {summary['val_nodes_scored']:,} of {n_val:,} nodes scored, each once; "
          f"best checkpoint {ckpt.best_model_path} (val_acc {ckpt.best_model_score:.4f})")
    print(f"test_acc {test['test_acc']:.4f} over {summary['test_nodes_scored']:,} of {n_test:,} test nodes "
          f"(chance {1 / task.num_classes:.4f})")
    path = write_summary(args.out, summary)
    print(f"summary written to {path} ({summary['seconds']} s)", flush=True)
    return summary


if __name__ == "__main__":
    main()
