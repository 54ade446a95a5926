"""GraphSAGE node classification as a ``GraphTask``; the README's main job.

    python -m graphtrainer.examples.node_classification --dataset tolokers --num-procs 2

prints per-epoch training loss and validation metric, then the test metric of the
best checkpoint. Binary datasets (Tolokers) report ROC-AUC, the others accuracy.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .. import GraphTask, ModelCheckpoint, PrintMetrics, Trainer, datasets
from ..distdgl.graph import PartitionedGraph
from ..evaluation.ranking import accuracy, roc_auc
from graphtrainer.models import SAGE


class CrossEntropySteps:
    """The training step and evaluation logging of the classification examples; a task
    using it provides ``_forward(batch) -> (logits, labels)`` (logits of the seed nodes),
    ``_eval_step(batch, prefix)`` and ``_eval_epoch_end(prefix)``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", accuracy(logits, labels))
        return loss

    def _log_eval(self, logits: torch.Tensor, labels: torch.Tensor, prefix: str) -> None:
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels))
        self.log(f"{prefix}_acc", accuracy(logits, labels))
        # A total, not a mean: reduce_fx="sum" adds the values of every call on every rank.
        self.log(f"{prefix}_nodes", labels.numel(), reduce_fx="sum")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")


def _refuse_heterograph(graph: Any) -> None:
    """One clear line for a heterograph (its ``ndata["feat"]`` is a dict per node type)."""
    ntypes = getattr(graph, "ntypes", ())
    if len(ntypes) > 1 or len(getattr(graph, "canonical_etypes", ())) > 1:
        raise ValueError(
            f"NodeClassification takes a homogeneous graph (one node and one edge type); this one has node "
            f"types {list(ntypes)} and edge types {list(getattr(graph, 'etypes', ()))}: use "
            "graphtrainer.examples.hetero_classification.HeteroClassification "
            "for heterographs")


class NodeClassification(CrossEntropySteps, GraphTask):
    """Minibatch GraphSAGE on ``graph`` (ndata ``feat``, ``label``, ``*_mask``), a shipped
    dataset's name (:func:`graphtrainer.datasets.load`), or a partitioned graph (a
    :class:`~graphtrainer.distdgl.graph.PartitionedGraph` or its ``<name>.json``: each machine
    trains on the masked nodes of its own partition).

    Training samples ``fanouts`` neighbours per layer; evaluation uses every neighbour, so it
    is exact. ``metric``: ``"accuracy"`` or ``"roc_auc"`` (from gathered positive-class
    scores). Epoch metrics: ``train_loss``, ``train_acc``; ``{val,test}_loss``, ``_acc``,
    ``_nodes`` (nodes scored, each once) and, with ``"roc_auc"``, ``_auc``. The tutorials
    override one piece each: :meth:`train_sampler`, ``configure_model``, ``training_step``.
    """

    def __init__(self, graph: Any, fanouts: Sequence[int] = (10, 10), hidden: int = 256,
                 dropout: float = 0.5, lr: float = 3e-3, weight_decay: float = 0.0,
                 batch_size: int = 1024, eval_batch_size: int = 4096, metric: str = "accuracy"):
        super().__init__()
        if metric not in ("accuracy", "roc_auc"):
            raise ValueError(f"metric={metric!r}: use 'accuracy' or 'roc_auc'")
        self.save_hyperparameters()        # plain arguments -> hparams.yaml and checkpoints
        if isinstance(graph, os.PathLike) or (isinstance(graph, str) and graph.endswith(".json")):
            graph = PartitionedGraph(graph)  # a partition config: the ranks open the graph
        elif isinstance(graph, str):       # a dataset name, e.g. from a config file
            graph = datasets.load(graph)
        _refuse_heterograph(graph)
        self.graph = graph                 # shared with the ranks (fork: copy-on-write)
        self.fanouts, self.hidden, self.dropout = list(fanouts), hidden, dropout
        self.lr, self.weight_decay, self.metric = lr, weight_decay, metric
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.in_feats = graph.ndata["feat"].shape[1]  # a PartitionedGraph's ndata holds shapes only
        if isinstance(graph, PartitionedGraph):  # read from the partition folder; the ranks open the graph
            self.num_classes = graph.num_classes
            self.split_ids: Optional[dict] = None
        else:
            self.num_classes = int(graph.ndata["label"].max()) + 1
            self.split_ids = {s: graph.ndata[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}
        self._scores: List[torch.Tensor] = []
        self._labels: List[torch.Tensor] = []

    # Built inside each rank (ranks must not share parameters); the trainer wraps it in DDP.
    def configure_model(self) -> torch.nn.Module:
        return SAGE(self.in_feats, self.hidden, self.num_classes,
                    num_layers=len(self.fanouts), dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def train_sampler(self) -> Any:
        """The training sampler: a list of fanouts (DGL's ``NeighborSampler``, prefetching
        ``feat`` for input nodes and ``label`` for seeds) or any DGL block sampler."""
        return self.fanouts

    def seeds(self, split: str) -> Any:
        """The nodes of ``split``: ids, or on a DistGraph its ``DistTensor`` mask (each
        machine then takes its own partition's nodes)."""
        if self.split_ids is None:
            return self.graph.ndata[f"{split}_mask"]
        return self.split_ids[split]

    # This rank's share of the seed nodes, from a new permutation every epoch.
    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.seeds("train"), self.train_sampler(), self.batch_size, shuffle=True)

    # Every id is scored exactly once over all ranks (no shuffling, no padding).
    def _eval_loader(self, split: str) -> Any:
        import dgl

        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(
            len(self.fanouts), prefetch_node_feats=["feat"], prefetch_labels=["label"])
        return self.node_dataloader(self.seeds(split), sampler, self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader("val")

    def test_dataloader(self) -> Any:
        return self._eval_loader("test")

    def predict_dataloader(self) -> Any:
        return self._eval_loader("test")

    def _forward(self, batch: Any) -> tuple:
        _, _, blocks = batch
        return self.model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]

    # training_step (CrossEntropySteps): backward, optimizer step and gradient sync are the
    # trainer's. The batch size (number of seeds) is read from the DGL batch: epoch values
    # are sum(value * n) / sum(n) over all batches of all ranks.
    def _eval_step(self, batch: Any, prefix: str) -> None:
        logits, labels = self._forward(batch)
        self._log_eval(logits, labels, prefix)
        if self.metric == "roc_auc":
            self._scores.append(torch.softmax(logits, dim=-1)[:, 1].cpu())
            self._labels.append(labels.cpu())

    def _eval_epoch_end(self, prefix: str) -> None:
        # ROC-AUC is not a mean of per-batch values: it needs every score of every rank.
        if self.metric != "roc_auc":
            return
        scores = torch.cat(self._scores) if self._scores else torch.empty(0)
        labels = torch.cat(self._labels) if self._labels else torch.empty(0, dtype=torch.long)
        self._scores, self._labels = [], []
        # Every rank gathers everything, so every rank logs the same exact ROC-AUC.
        self.log(f"{prefix}_auc", roc_auc(self.all_gather(scores), self.all_gather(labels)), batch_size=1)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, _ = self._forward(batch)
        return torch.softmax(logits, dim=-1)      # one row per seed, in the batch's order


def standardize_features(graph: Any, key: str = "feat") -> None:
    """Scale each feature column to zero mean and unit variance by the training nodes' statistics
    (Tolokers' raw counts and rates: GraphSAGE then learns in a third of the epochs)."""
    x = graph.ndata[key].float()
    train = x[graph.ndata["train_mask"]]
    graph.ndata[key] = (x - train.mean(0)) / train.std(0).clamp_min(1e-6)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="tolokers", choices=datasets.KNOWN)
    parser.add_argument("--split", type=int, default=0, help="Tolokers: which of its 10 fixed splits")
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--launcher", default="auto", choices=("auto", "fork", "spawn"))
    parser.add_argument("--sampling", default="auto", choices=("auto", "device", "cpu"),
                        help="where loaders sample: 'auto' is the GPU on GPU ranks, DGL on CPU ranks")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs")
    args = parser.parse_args(argv)

    graph = datasets.load(args.dataset, split=args.split)
    binary = int(graph.ndata["label"].max()) == 1
    if binary:  # dense numeric features (Tolokers); bag-of-words features stay as they are
        standardize_features(graph)
    metric = "roc_auc" if binary else "accuracy"
    monitor = "val_auc" if binary else "val_acc"
    task = NodeClassification(graph, fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                              dropout=args.dropout, lr=args.lr, batch_size=args.batch_size, metric=metric)
    ckpt = ModelCheckpoint(monitor=monitor, mode="max", filename="{epoch}-{" + monitor + ":.4f}")
    trainer = Trainer(gpus=args.gpus, num_procs=None if args.gpus else args.num_procs, launcher=args.launcher,
                      sampling=args.sampling,
                      max_epochs=args.epochs, seed=args.seed, default_root_dir=args.root_dir,
                      callbacks=[ckpt, PrintMetrics(["train_loss", "val_loss", monitor])])
    print(f"{args.dataset}: {graph.num_nodes()} nodes, {graph.num_edges()} edges; "
          f"{trainer.num_procs} {'GPU' if args.gpus else 'CPU'} processes ({args.launcher})", flush=True)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    name = "test_auc" if binary else "test_acc"
    print(f"best checkpoint {ckpt.best_model_path} ({monitor} {ckpt.best_model_score:.4f})")
    print(f"{name} {result[name]:.4f}", flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
