"""Tutorial 1: quick start. GraphSAGE on Cora with 2 processes, best checkpoint, reload, predict.

What you will see: one ``GraphTask`` (model, loaders, steps, optimizer) trained by
``Trainer(num_procs=2)`` on two CPU processes over gloo; validation accuracy every
epoch, reduced exactly over both ranks; the best epoch saved by ``ModelCheckpoint``;
the test accuracy of that checkpoint; and its predictions, obtained twice: with
``trainer.predict(task, ckpt_path="best")`` and by loading the checkpoint's
``state_dict`` into a fresh model in a plain Python process, with no trainer at all.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/01_quickstart_cora.py

Output of that command, measured on this project's 2-core machine (2 CPU ranks; the
``RESULT`` JSON line is cut short here; the whole command took 10.7 s of wall time,
interpreter start-up and imports included). ``--fast`` runs 8 epochs and is the CI
smoke test (``tests/test_tutorial_01.py``):

    cora: 2708 nodes, 10556 edges, 1433 features, 7 classes; train/val/test 140/500/1000
    epoch   0  train_loss 1.9324  train_acc 0.2214  val_loss 1.9069  val_acc 0.4860
    epoch   1  train_loss 1.8359  train_acc 0.6143  val_loss 1.8500  val_acc 0.7020
    epoch   2  train_loss 1.7508  train_acc 0.7857  val_loss 1.7869  val_acc 0.7100
    ...
    epoch  17  train_loss 0.2704  train_acc 0.9929  val_loss 0.9006  val_acc 0.7920
    ...
    epoch  38  train_loss 0.1009  train_acc 1.0000  val_loss 0.7539  val_acc 0.7880
    epoch  39  train_loss 0.0856  train_acc 1.0000  val_loss 0.7500  val_acc 0.7900
    fit: 40 epochs in 6.0 s; best checkpoint runs/tutorial01/version_0/checkpoints/epoch=17-val_acc=0.7920.ckpt (val_acc 0.7920)
    test (best checkpoint, 2 ranks, exact): test_acc 0.8160 over 1000 nodes
    predict (best checkpoint, 2 ranks): 1000 rows; accuracy 0.8160
    fresh model + checkpoint state_dict, full-graph inference in this process: test accuracy 0.8160; same arg-max as predict() for 1000/1000 nodes
    RESULT {"tutorial": "01_quickstart_cora", "num_procs": 2, "epochs": 40, "final_train_loss": 0.08559367507696151, ...}
    total 6.6 s

For comparison, ``../shared/datasets/README.md`` lists 81.5 % for GCN on this split
(Kipf & Welling 2017) and ~83.3 % for DGL's full-graph GraphSAGE example; this one
samples 10 neighbours per layer and keeps the epoch with the best validation accuracy.

The classic hand-written workflow, and what replaces each step
---------------------------------------------------------------
A hand-written multi-process DGL script (the shape of DGL's multi-GPU tutorials and of
PyTorch's DDP tutorial) has these steps; the arrow after each says what replaces it.

1. ``g = CoraGraphDataset()[0]``; ``g.create_formats_()`` so forked children share the
   sparse formats copy-on-write.                -> ``graphtrainer.datasets.load("cora")``;
                                                   the trainer calls ``create_formats_()``.
2. ``def run(rank, world_size): dist.init_process_group("gloo",
   init_method="tcp://127.0.0.1:12345", rank=rank, world_size=world_size)``
   (a hard-coded port: two jobs on one machine collide).
                                                -> ``Trainer(num_procs=2)`` picks a free
                                                   port and starts the group in each rank.
3. ``model = DDP(SAGE(...))``, built inside ``run`` so ranks do not share parameters.
                                                -> ``configure_model()``; DDP is applied for you.
4. ``DataLoader(g, train_ids, sampler, use_ddp=True, ...)`` and ``set_epoch(epoch)``.
   (DGL 2.1's loader has no ``set_epoch``, and ``use_ddp`` gives every rank the same
   contiguous slice every epoch.)
                                                -> ``self.node_dataloader(ids, fanouts, bs)``:
                                                   a new global permutation each epoch.
5. The epoch loop: ``zero_grad``, forward, ``loss.backward()``, ``step``; ranks with
   fewer batches hang DDP unless wrapped in ``Join``.
                                                -> ``training_step`` returns the loss.
6. Validation: usually on rank 0 only (the others idle), or each rank evaluates its
   share and ``all_reduce``-s a *mean of per-rank accuracies* (wrong when shares differ).
                                                -> ``validation_step`` + ``self.log``: exact
                                                   mean over every node of every rank
                                                   (``reduce_fx="sum"``: a total, e.g.
                                                   the nodes scored).
7. ``if rank == 0 and acc > best: torch.save(model.module.state_dict(), path)``;
   ``dist.barrier()``.                          -> ``ModelCheckpoint(monitor="val_acc")``:
                                                   rank 0 writes atomically, then a barrier.
8. ``mp.spawn(run, nprocs=2)``, or ``dgl.multiprocessing.Process`` + ``join()``; with the
   latter a rank that crashes leaves its peers blocked in their next collective.
                                                -> ``trainer.fit(task)``; a failing rank
                                                   ends the rest and raises here.
9. Reload the best weights, test, predict: another script, or more code in ``run``.
                                                -> ``trainer.test(task, ckpt_path="best")``,
                                                   ``trainer.predict(task, ckpt_path="best")``.

The checkpoint is a plain ``torch.save`` dict: ``ckpt["state_dict"]`` (no ``module.``
prefix) loads into the bare model, as the end of :func:`main` shows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import GraphTask, ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402
from graphtrainer.metrics import accuracy  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402


class CoraSAGE(GraphTask):
    """Minibatch GraphSAGE node classification: everything a researcher writes."""

    def __init__(self, graph: Any, fanouts: Sequence[int] = (10, 10), hidden: int = 128,
                 dropout: float = 0.6, lr: float = 5e-3, weight_decay: float = 5e-4,
                 batch_size: int = 32, eval_batch_size: int = 512):
        super().__init__()
        self.save_hyperparameters()        # plain arguments -> hparams.yaml and checkpoints
        self.graph = graph                 # shared with the ranks (fork: copy-on-write)
        self.fanouts, self.hidden, self.dropout = list(fanouts), hidden, dropout
        self.lr, self.weight_decay = lr, weight_decay
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_classes = int(graph.ndata["label"].max()) + 1
        self.ids = {s: graph.ndata[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}

    # Classic step 3: the model, built inside each rank; the trainer wraps it in DDP.
    def configure_model(self) -> torch.nn.Module:
        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, self.num_classes,
                    num_layers=len(self.fanouts), dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    # Classic step 4: each rank's share of the seed nodes. A list of fanouts means DGL's
    # NeighborSampler, prefetching ndata["feat"] for the inputs and ["label"] for the seeds.
    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids["train"], self.fanouts, self.batch_size)

    # Evaluation takes every neighbour, so it is exact; every id is scored exactly once
    # over all ranks (the trainer turns off shuffling and padding for these loaders).
    def _eval_loader(self, split: str) -> Any:
        import dgl

        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(
            len(self.fanouts), prefetch_node_feats=["feat"], prefetch_labels=["label"])
        return self.node_dataloader(self.ids[split], sampler, self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader("val")

    def test_dataloader(self) -> Any:
        return self._eval_loader("test")

    def predict_dataloader(self) -> Any:
        return self._eval_loader("test")

    def _forward(self, batch: Any) -> tuple:
        input_nodes, seeds, blocks = batch
        return self.model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]

    # Classic step 5: one step. Backward, optimizer step, Join and gradient sync are the trainer's.
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        # The batch size (number of seeds) is read from the DGL batch: epoch values are
        # sum(value * n) / sum(n) over all batches of all ranks.
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", accuracy(logits, labels))
        return loss

    # Classic step 6: every rank scores its share; the trainer reduces exactly.
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        logits, labels = self._forward(batch)
        self.log("val_loss", F.cross_entropy(logits, labels))
        self.log("val_acc", accuracy(logits, labels))
        # A total, not a mean: how many nodes all ranks scored together (each id once,
        # none padded or dropped). reduce_fx="sum" adds the values of every call on every rank.
        self.log("val_nodes", labels.numel(), reduce_fx="sum")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        logits, labels = self._forward(batch)
        self.log("test_acc", accuracy(logits, labels))
        self.log("test_nodes", labels.numel(), reduce_fx="sum")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, _ = self._forward(batch)
        return torch.softmax(logits, dim=-1)      # one row per seed, in the batch's order


class PrintEpoch(Callback):
    """One line per epoch on rank 0 with the reduced metrics."""

    monitoring = True           # runs after the epoch's metrics are reduced

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        if trainer.rank == 0:
            m = trainer.callback_metrics
            print(f"epoch {trainer.current_epoch:3d}  train_loss {m['train_loss']:.4f}  "
                  f"train_acc {m['train_acc']:.4f}  val_loss {m['val_loss']:.4f}  "
                  f"val_acc {m['val_acc']:.4f}", flush=True)


def full_graph_inference(model: torch.nn.Module, graph: Any) -> torch.Tensor:
    """Logits for every node, the whole graph as each layer's "block" (no sampling, no trainer)."""
    model.eval()
    with torch.no_grad():
        return model([graph] * len(model.layers), graph.ndata["feat"])


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--dropout", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial01", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="8 epochs: the CI smoke test")
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs = 8

    from graphtrainer import datasets

    started = time.time()
    graph = datasets.load("cora")       # offline: ../shared/datasets (or $GRAPHTRAINER_DATA)
    task = CoraSAGE(graph, fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                    lr=args.lr, dropout=args.dropout, batch_size=args.batch_size)
    print(f"cora: {graph.num_nodes()} nodes, {graph.num_edges()} edges, {graph.ndata['feat'].shape[1]} "
          f"features, {task.num_classes} classes; train/val/test "
          f"{len(task.ids['train'])}/{len(task.ids['val'])}/{len(task.ids['test'])}", flush=True)

    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    trainer = Trainer(num_procs=args.num_procs, max_epochs=args.epochs, seed=args.seed,
                      default_root_dir=args.root_dir, callbacks=[ckpt, PrintEpoch()], progress_bar=False)
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best checkpoint {ckpt.best_model_path} "
          f"(val_acc {ckpt.best_model_score:.4f})", flush=True)

    # Test the best checkpoint: the ranks load it, score their shares, reduce exactly.
    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {args.num_procs} ranks, exact): test_acc {test['test_acc']:.4f} "
          f"over {int(test['test_nodes'])} nodes", flush=True)

    # Predict with the best checkpoint: rows come back in the order of the ids given.
    probs = trainer.predict(task, ckpt_path="best")
    labels = graph.ndata["label"][task.ids["test"]]
    pred_acc = float((probs.argmax(-1) == labels).float().mean())
    print(f"predict (best checkpoint, {args.num_procs} ranks): {probs.shape[0]} rows; accuracy {pred_acc:.4f}",
          flush=True)

    # Reload by hand: the checkpoint is a torch.save dict; its state_dict fits the bare model.
    state = torch.load(ckpt.best_model_path, map_location="cpu", weights_only=True)
    fresh = SAGE(graph.ndata["feat"].shape[1], task.hidden, task.num_classes, num_layers=len(task.fanouts))
    fresh.load_state_dict(state["state_dict"])
    logits = full_graph_inference(fresh, graph)[task.ids["test"]]
    fresh_acc = float((logits.argmax(-1) == labels).float().mean())
    agree = int((logits.argmax(-1) == probs.argmax(-1)).sum())
    print(f"fresh model + checkpoint state_dict, full-graph inference in this process: test accuracy "
          f"{fresh_acc:.4f}; same arg-max as predict() for {agree}/{len(labels)} nodes", flush=True)

    last = trainer.history[-1]
    result = {
        "tutorial": "01_quickstart_cora", "num_procs": args.num_procs, "epochs": trainer.current_epoch,
        "final_train_loss": last["train_loss"], "final_val_acc": last["val_acc"],
        "val_nodes": int(last["val_nodes"]), "best_val_acc": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_nodes": int(test["test_nodes"]),
        "predict_rows": int(probs.shape[0]), "predict_acc": pred_acc,
        "fresh_model_acc": fresh_acc, "fresh_model_agree": agree,
        "checkpoint": ckpt.best_model_path, "checkpoint_epoch": int(state["epoch"]),
        "log_dir": str(trainer.log_dir), "fit_seconds": round(fit_s, 1),
        "seconds": round(time.time() - started, 1),
    }
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    print(f"total {result['seconds']:.1f} s", flush=True)
    return result


if __name__ == "__main__":
    main()
