"""Tutorial 8: graph classification with 2 processes: many small graphs, batched, exact evaluation, predict in dataset order.

What you will see: DGL's ``MiniGCDataset`` (8 families of small synthetic graphs,
generated here, nothing downloaded), or your own dataset in the TU text format, packed
once into a few flat tensors that the ranks share; a ``GraphConv`` network with a mean
readout trained on ``self.graph_dataloader`` batches (``dgl.batch`` of each rank's share
of the graphs, a new split every epoch); validation and test accuracy with every graph
counted exactly once; ``predict`` returning one row per graph in dataset order; and the
same run with ``--launcher spawn``.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/08_graph_classification.py

What to look at: ``val_acc`` over the 100 validation graphs per epoch, the test accuracy
of the best checkpoint, each graph counted once, and ``predict``'s rows, in dataset
order, giving the same accuracy. ``--launcher spawn`` gives the same numbers (the
packed tensors arrive in shared memory; only the start is slower). ``--fast`` (400
graphs, 25 epochs) is the CI smoke test; ``--tu-folder DIR --tu-name NAME`` reads
``DIR/NAME_A.txt``, ``NAME_graph_indicator.txt``, ``NAME_graph_labels.txt`` and, when
present, ``NAME_node_attributes.txt``.

Measured output: ``tutorials/results/08_graph_classification.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_08.py``) runs ``--fast`` and checks its figures against
``tutorials/results/08_graph_classification.json``.

The classic hand-written workflow, and what replaces each step
---------------------------------------------------------------
1. ``GraphDataLoader(dataset, batch_size=..., use_ddp=True)`` and ``set_epoch``.
   DGL 2.1 pads the last rank with repeats, so evaluation over it counts some graphs twice
   (151 graphs on 2 ranks: 152 counted) and ``predict`` rows come back neither complete
   nor in dataset order.                        -> ``self.graph_dataloader(graphs, bs, idx)``:
                                                   a global permutation per epoch for
                                                   training; each graph once, rows in the
                                                   order of ``idx`` for evaluation.
2. With spawn, the dataset (thousands of ``DGLGraph`` objects) is pickled to every rank,
   each graph with its own shared-memory segments.
                                                -> ``PackedGraphs(dataset)``: the edges,
                                                   features and labels of all graphs in a
                                                   few flat tensors + offsets; a batch is
                                                   rebuilt from slices (equal to
                                                   ``dgl.batch`` of the originals).
3. Epoch metrics: the mean of per-batch accuracies (wrong for a short last batch), then
   the mean over ranks (wrong when shares differ).
                                                -> ``self.log`` weighs each batch by its
                                                   number of graphs (inferred from the
                                                   batched graph); exact over all ranks.
4. Fewer graphs than ranks, or an empty dataset: a hang or a crash in one rank.
                                                -> a ``ValueError`` saying so, before any batch.
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

from graphtrainer import GraphTask, ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402
from graphtrainer.data.graph_loader import PackedGraphs  # noqa: E402
from graphtrainer.evaluation.ranking import accuracy  # noqa: E402
from graphtrainer.models import GraphClassifier  # noqa: E402
from tutorials.summary import report  # noqa: E402


class GraphClassification(GraphTask):
    """GraphConv + mean readout graph classification: everything a researcher writes."""

    def __init__(self, dataset: Any, split: Dict[str, torch.Tensor], hidden: int = 128, lr: float = 5e-3,
                 batch_size: int = 32, eval_batch_size: int = 128):
        super().__init__()
        self.save_hyperparameters("hidden", "lr", "batch_size")
        self.graphs = PackedGraphs(dataset)       # classic step 2: packed once, shared by the ranks
        self.split = split
        self.hidden, self.lr, self.batch_size, self.eval_batch_size = hidden, lr, batch_size, eval_batch_size
        self.num_classes = int(self.graphs.labels.max()) + 1

    def configure_model(self) -> torch.nn.Module:
        return GraphClassifier(self.graphs.ndata["feat"].shape[1], self.hidden, self.num_classes)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    # Classic step 1: batches of whole graphs over each rank's share of the indices.
    def train_dataloader(self) -> Any:
        return self.graph_dataloader(self.graphs, self.batch_size, self.split["train"])

    def val_dataloader(self) -> Any:
        return self.graph_dataloader(self.graphs, self.eval_batch_size, self.split["val"], shuffle=False)

    def test_dataloader(self) -> Any:
        return self.graph_dataloader(self.graphs, self.eval_batch_size, self.split["test"], shuffle=False)

    predict_dataloader = test_dataloader

    def _forward(self, batch: Any) -> tuple:
        graph, labels = batch                     # dgl.batch of the graphs, their labels
        return self.model(graph, graph.ndata["feat"]), labels

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)              # weighted by the number of graphs
        self.log("train_acc", accuracy(logits, labels))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        logits, labels = self._forward(batch)
        self.log("val_acc", accuracy(logits, labels))
        self.log("val_graphs", labels.numel(), reduce_fx="sum")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        logits, labels = self._forward(batch)
        self.log("test_acc", accuracy(logits, labels))
        self.log("test_graphs", labels.numel(), reduce_fx="sum")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.softmax(self._forward(batch)[0], -1)   # one row per graph


class PrintEpoch(Callback):
    after_reduction = True

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        if trainer.rank == 0 and (trainer.current_epoch % 10 == 9 or trainer.current_epoch < 2):
            m = trainer.callback_metrics
            print(f"epoch {trainer.current_epoch:3d}  train_loss {m['train_loss']:.4f}  train_acc "
                  f"{m['train_acc']:.4f}  val_acc {m['val_acc']:.4f} ({int(m['val_graphs'])} graphs)", flush=True)


def load_data(args: argparse.Namespace) -> list:
    from graphtrainer import datasets

    if args.tu_folder:
        return datasets.read_tu(args.tu_folder, args.tu_name)
    return datasets.minigc(args.num_graphs, 10, 20, seed=args.seed)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--launcher", default="fork", choices=("fork", "spawn"))
    parser.add_argument("--num-graphs", type=int, default=1000, help="MiniGC graphs")
    parser.add_argument("--tu-folder", default=None, help="read a TU-format dataset from this folder")
    parser.add_argument("--tu-name", default=None, help="the TU dataset's file prefix, e.g. PROTEINS")
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial08", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="400 graphs, 25 epochs: the CI smoke test")
    args = parser.parse_args(argv)
    if args.tu_folder and not args.tu_name:
        parser.error("--tu-folder needs --tu-name")
    if args.fast:
        args.epochs, args.num_graphs = 25, min(args.num_graphs, 400)

    started = time.time()
    data = load_data(args)
    n = len(data)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed))
    n_train, n_val = int(0.8 * n), int(0.1 * n)
    split = {"train": perm[:n_train], "val": perm[n_train:n_train + n_val], "test": perm[n_train + n_val:]}
    task = GraphClassification(data, split, hidden=args.hidden, lr=args.lr, batch_size=args.batch_size)
    sizes = task.graphs.num_nodes.float()
    print(f"{args.tu_name or 'MiniGC'}: {n} graphs, {task.num_classes} classes, {sizes.mean():.1f} nodes per graph "
          f"on average; train/val/test {n_train}/{n_val}/{n - n_train - n_val}; launcher {args.launcher}", flush=True)

    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    trainer = Trainer(num_procs=args.num_procs, launcher=args.launcher, max_epochs=args.epochs, seed=args.seed,
                      default_root_dir=args.root_dir, callbacks=[ckpt, PrintEpoch()], progress_bar=False)
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best val_acc {ckpt.best_model_score:.4f} "
          f"({Path(ckpt.best_model_path).name})", flush=True)

    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {args.num_procs} ranks, exact): test_acc {test['test_acc']:.4f} over "
          f"{int(test['test_graphs'])} graphs", flush=True)

    # predict: one row per test graph, in the order of split["test"].
    probs = trainer.predict(task, ckpt_path="best")
    labels = task.graphs.labels[split["test"]]
    pred_acc = float((probs.argmax(-1) == labels).float().mean())
    print(f"predict: {probs.shape[0]} rows in dataset order; accuracy against the labels in that order "
          f"{pred_acc:.4f}", flush=True)

    result = {
        "tutorial": "08_graph_classification", "dataset": args.tu_name or "MiniGC", "launcher": args.launcher,
        "num_procs": args.num_procs, "epochs": trainer.current_epoch, "graphs": n,
        "val_graphs": int(trainer.history[-1]["val_graphs"]), "best_val_acc": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_graphs": int(test["test_graphs"]),
        "predict_rows": int(probs.shape[0]), "predict_acc": pred_acc,
        "final_train_loss": trainer.history[-1]["train_loss"], "checkpoint": ckpt.best_model_path,
        "fit_seconds": round(fit_s, 1), "seconds": round(time.time() - started, 1),
    }
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()
