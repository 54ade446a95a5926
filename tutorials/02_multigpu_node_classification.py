"""Tutorial 2: DGL's "Single Machine Multi-GPU Minibatch Node Classification", as a GraphTask.

DGL's tutorial (``tutorials/multi/2_node_classification.py`` in dmlc/dgl) trains a
two-layer GraphSAGE on ogbn-arxiv with one process per GPU. This script keeps its
model, sampler and hyper-parameters (``SAGEConv`` mean aggregator, hidden 128, fanouts
[4, 4], 1024 seeds per rank and batch, ``Adam()`` with its default learning rate) and
moves everything else into graphtrainer.

Run it here (Tolokers from the shipped data; 2 CPU processes):

    bash scripts/env.sh python tutorials/02_multigpu_node_classification.py

With OGB's ogbn-arxiv files on disk (see "ogbn-arxiv" below):

    bash scripts/env.sh python tutorials/02_multigpu_node_classification.py \\
        --dataset ogbn-arxiv --ogb-root /data/ogb          # or OGB_ROOT=/data/ogb

What to look at: ``val_auc`` rising epoch by epoch, the epoch ``ModelCheckpoint`` keeps,
and the test ROC-AUC and accuracy of that checkpoint over all 2,940 test nodes (each
rank scores its share). ``--fast`` runs 3 epochs.

Measured output: ``tutorials/results/02_multigpu_node_classification.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_02.py``) runs ``--fast`` and checks its figures against
``tutorials/results/02_multigpu_node_classification.json``.

DGL's settings learn slowly here: each epoch is only 3 optimizer steps per rank
(5,879 training nodes, 1,024 per batch, 2 ranks), with Adam's default learning rate;
the validation ROC-AUC is still rising at the end (the results file also gives DGL's own
10 epochs and ``--lr 1e-2``).

Tolokers (11,758 nodes, 1,038,000 edges, 10 features, 2 classes, 50/25/25 split) is
imbalanced, 78 % of nodes are class 0, so accuracy says little; ROC-AUC is its
published metric (GraphSAGE 82.43 +- 0.44, Platonov et al., ICLR 2023, with full
training; this tutorial runs DGL's small settings for a few epochs).

The hand-written steps of DGL's tutorial, and what replaces them
----------------------------------------------------------------
1. Load the dataset at module level; ``dgl.add_reverse_edges(graph)`` (arxiv's citation
   edges point one way); ``graph.create_formats_()`` before forking, so the children
   share CSR/CSC copy-on-write instead of each building its own.
       -> :func:`load_ogbn_arxiv` below (same steps); the trainer calls ``create_formats_()``.
2. ``def run(proc_id, devices)``: ``init_process_group("gloo" or "nccl",
   "tcp://127.0.0.1:12345", world_size, rank)`` (a fixed port), ``torch.cuda.set_device``.
       -> ``Trainer(num_procs=2)`` / ``Trainer(gpus=4)``: free port, backend, device.
          The ranks are forked, and a forked child cannot use CUDA once the parent has
          used it (``torch.cuda.is_available()`` counts, unless
          ``PYTORCH_NVML_BASED_CUDA_CHECK=1``): ``Trainer(gpus=...)`` then falls back to
          spawn with a warning (``launcher="fork"`` raises instead). Use
          ``torch.cuda.device_count()`` in the parent; it is fork-safe.
3. ``DataLoader(graph, train_nids, NeighborSampler([4, 4]), use_ddp=True, batch_size=1024,
   shuffle=True)`` and ``train_dataloader.set_epoch(epoch)``.
       -> ``self.node_dataloader(train_ids, sampler, 1024)``. DGL 2.1's ``use_ddp`` has no
          ``set_epoch`` any more (the tutorial's call fails on 2.1), ignores ``ddp_seed``
          and hands every rank the *same contiguous slice* each epoch, shuffling only inside
          it with each process's own ``np.random`` (measured on DGL 2.1).
          ``node_dataloader`` permutes all ids from ``(seed, epoch)``,
          identically on every rank, then splits: each rank sees new nodes every epoch.
4. ``model = DDP(Model(...).to(device), device_ids=...)``; ``Adam``.
       -> ``configure_model`` / ``configure_optimizers``.
5. The loop: forward, ``cross_entropy``, ``zero_grad``, ``backward``, ``step``, a tqdm bar
   with per-batch accuracy.
       -> ``training_step`` (returns the loss; a bar on rank 0 when run in a terminal).
6. Evaluation "on only the first GPU": rank 0 scores the whole validation set while the
   other ranks wait (on a cluster, idle GPUs), with a non-DDP loader.
       -> ``validation_step`` on *every* rank over its own disjoint share; accuracy is
          reduced exactly (sum of correct / sum of nodes), and ROC-AUC is computed from
          the scores gathered from all ranks. Evaluation here uses every neighbour
          (``MultiLayerFullNeighborSampler``), not the training fanouts, so it is exact.
7. ``if best_accuracy < accuracy: torch.save(model.state_dict(), './model.pt')`` on rank 0
   (keys carry DDP's ``module.`` prefix; no barrier, no atomic write).
       -> ``ModelCheckpoint(monitor=...)``: plain keys, atomic write, barrier.
8. ``dgl.multiprocessing.Process(target=run, ...)`` per GPU, ``start``, ``join``.
       -> ``trainer.fit(task)``; ``trainer.test(task, ckpt_path="best")``.

ogbn-arxiv
----------
This project's machines cannot download, so the tutorial reads OGB's own raw files when
they are present. OGB's ``DglNodePropPredDataset("ogbn-arxiv", root=R)`` keeps them as::

    R/ogbn_arxiv/raw/edge.csv.gz          one "src,dst" row per citation (|E| = 1,166,243)
    R/ogbn_arxiv/raw/node-feat.csv.gz     |V| = 169,343 rows of 128 floats
    R/ogbn_arxiv/raw/node-label.csv.gz    one class id (0..39) per row
    R/ogbn_arxiv/raw/node_year.csv.gz     publication year per row (optional here)
    R/ogbn_arxiv/raw/num-node-list.csv.gz, num-edge-list.csv.gz   (one row each)
    R/ogbn_arxiv/split/time/{train,valid,test}.csv.gz   node ids, one per row

(Older OGB releases' DGL loader used ``R/ogbn_arxiv_dgl``, and ``arxiv.zip`` unpacks as
``arxiv/``: ``R/ogbn_arxiv_dgl``, ``R/arxiv`` or ``R`` itself holding ``raw/`` and
``split/`` are accepted too.) :func:`load_ogbn_arxiv` builds the same graph
as DGL's tutorial: the citation edges plus their reverses, ``feat``, ``label``,
``year`` and the time-split masks. When the files are missing, it says which and where
it looked, and the script exits with status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification, standardize_features  # noqa: E402
from tutorials.summary import report  # noqa: E402

OGB_ROOT_ENV = "OGB_ROOT"
ARXIV_REQUIRED = ("raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz",
                  "split/time/train.csv.gz", "split/time/valid.csv.gz", "split/time/test.csv.gz")


# ---------------------------------------------------------------------------------------
# 1. Data: OGB's ogbn-arxiv raw layout, read without the ogb package.
# ---------------------------------------------------------------------------------------
class OgbFilesMissing(FileNotFoundError):
    """ogbn-arxiv's raw files are not where they were looked for."""


def find_arxiv_folder(root: os.PathLike | str) -> Path:
    """The folder holding ``raw/`` and ``split/``: ``root/ogbn_arxiv`` (OGB's layout),
    ``root/ogbn_arxiv_dgl`` (older OGB releases' DGL loader), ``root/arxiv`` (OGB's zip
    unpacked by hand) or ``root`` itself."""
    root = Path(root).expanduser().absolute()
    candidates = [root / "ogbn_arxiv", root / "ogbn_arxiv_dgl", root / "arxiv", root]
    for folder in candidates:
        if (folder / "raw" / "edge.csv.gz").is_file():
            missing = [f for f in ARXIV_REQUIRED if not (folder / f).is_file()]
            if missing:
                raise OgbFilesMissing(f"ogbn-arxiv at {folder} is incomplete: missing "
                                      + ", ".join(str(folder / f) for f in missing))
            return folder
    raise OgbFilesMissing(
        f"ogbn-arxiv not found under {root}: looked for raw/edge.csv.gz in "
        + ", ".join(str(c) for c in candidates)
        + ". Expected OGB's layout <root>/ogbn_arxiv/{" + ", ".join(ARXIV_REQUIRED) + "}. "
        "Nothing is downloaded here: copy OGB's arxiv files there (on a machine with internet, "
        "ogb.nodeproppred.DglNodePropPredDataset('ogbn-arxiv', root=<root>) fetches them), "
        f"point --ogb-root or ${OGB_ROOT_ENV} at <root>, or run the default --dataset tolokers.")


def _read_csv(path: Path, dtype: Any) -> Any:
    """A headerless gzip CSV as a writable 2-D NumPy array (OGB reads them the same way)."""
    import numpy as np
    import pandas as pd

    try:
        return np.array(pd.read_csv(path, compression="gzip", header=None).to_numpy(), dtype=dtype)
    except pd.errors.EmptyDataError:
        return np.zeros((0, 1), dtype=dtype)


def load_ogbn_arxiv(root: os.PathLike | str) -> Any:
    """ogbn-arxiv as DGL's tutorial builds it, from OGB's raw CSV files under ``root``.

    The graph holds the citation edges (``edge.csv.gz`` rows, src -> dst) followed by
    their reverses (``dgl.add_reverse_edges``: edge ``i + E`` is edge ``i`` turned
    around); ``ndata``: ``feat`` (float32), ``label`` (int64), ``year`` (int64, when
    ``node_year.csv.gz`` exists) and ``train_mask``/``val_mask``/``test_mask`` from
    ``split/time``. Raises :class:`OgbFilesMissing` naming what is missing, and
    ``ValueError`` when the files disagree (row counts, ids out of range).
    """
    import dgl
    import numpy as np

    folder = find_arxiv_folder(root)
    raw, split = folder / "raw", folder / "split" / "time"
    edges = _read_csv(raw / "edge.csv.gz", np.int64)                    # (E, 2)
    feat = _read_csv(raw / "node-feat.csv.gz", np.float32)              # (N, 128)
    label = _read_csv(raw / "node-label.csv.gz", np.int64)[:, 0]        # (N,)
    num_nodes = feat.shape[0]
    if (raw / "num-node-list.csv.gz").is_file():
        num_nodes = int(_read_csv(raw / "num-node-list.csv.gz", np.int64).sum())
    if feat.shape[0] != num_nodes or label.shape[0] != num_nodes:
        raise ValueError(f"{raw}: {num_nodes} nodes but {feat.shape[0]} feature rows and "
                         f"{label.shape[0]} label rows")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"{raw / 'edge.csv.gz'}: expected two columns (src,dst), got shape {edges.shape}")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"{raw / 'edge.csv.gz'}: node ids must lie in [0, {num_nodes})")

    src, dst = torch.from_numpy(edges[:, 0].copy()), torch.from_numpy(edges[:, 1].copy())
    graph = dgl.graph((src, dst), num_nodes=num_nodes)
    # As in DGL's tutorial: "Add reverse edges since ogbn-arxiv is unidirectional."
    graph = dgl.add_reverse_edges(graph)
    graph.ndata["feat"] = torch.from_numpy(feat)
    graph.ndata["label"] = torch.from_numpy(label)
    if (raw / "node_year.csv.gz").is_file():
        graph.ndata["year"] = torch.from_numpy(_read_csv(raw / "node_year.csv.gz", np.int64)[:, 0].copy())
    for name, mask in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        ids = torch.from_numpy(_read_csv(split / f"{name}.csv.gz", np.int64)[:, 0].copy())
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
            raise ValueError(f"{split / name}.csv.gz: node ids must lie in [0, {num_nodes})")
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[ids] = True
        graph.ndata[mask] = m
    return graph


def load_graph(name: str, ogb_root: Optional[str]) -> Any:
    if name == "ogbn-arxiv":
        return load_ogbn_arxiv(ogb_root or os.environ.get(OGB_ROOT_ENV) or "dataset")
    from graphtrainer import datasets

    graph = datasets.load(name)          # Tolokers: split 0 of its 10 fixed splits
    if name == "tolokers":
        # Tolokers' 10 features are raw counts and rates on very different scales
        # (arxiv's are already word-embedding averages). Scale with training-set statistics.
        standardize_features(graph)
    return graph


# ---------------------------------------------------------------------------------------
# 2. The model: DGL's tutorial's, unchanged.
# ---------------------------------------------------------------------------------------
class Model(nn.Module):
    """Two ``SAGEConv`` layers over two message flow graphs (blocks), as in DGL's tutorial."""

    def __init__(self, in_feats: int, h_feats: int, num_classes: int):
        super().__init__()
        from dgl.nn import SAGEConv

        self.conv1 = SAGEConv(in_feats, h_feats, aggregator_type="mean")
        self.conv2 = SAGEConv(h_feats, num_classes, aggregator_type="mean")
        self.h_feats = h_feats

    def forward(self, mfgs: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
        h_dst = x[:mfgs[0].num_dst_nodes()]          # a block's dst nodes come first in its src nodes
        h = self.conv1(mfgs[0], (x, h_dst))
        h = F.relu(h)
        h_dst = h[:mfgs[1].num_dst_nodes()]
        return self.conv2(mfgs[1], (h, h_dst))


# ---------------------------------------------------------------------------------------
# 3. The task: steps 3-7 of the hand-written run(), minus the plumbing.
# ---------------------------------------------------------------------------------------
class MultiGPUNodeClassification(NodeClassification):
    """DGL's tutorial's model and sampler in the example's node-classification task.

    Everything else (loaders, steps, exact evaluation with every neighbour, ROC-AUC from
    the scores gathered from all ranks) is :class:`NodeClassification`'s, in
    ``graphtrainer/examples/node_classification.py``. With 2 classes it reports ROC-AUC.
    """

    def __init__(self, graph: Any, fanouts: Sequence[int] = (4, 4), hidden: int = 128,
                 batch_size: int = 1024, lr: float = 1e-3):
        binary = int(graph.ndata["label"].max()) == 1
        # DGL's tutorial: Adam(lr) without weight decay, evaluation in batches of the same size.
        super().__init__(graph, fanouts=fanouts, hidden=hidden, lr=lr, batch_size=batch_size,
                         eval_batch_size=batch_size, metric="roc_auc" if binary else "accuracy")
        self.binary = binary

    def configure_model(self) -> nn.Module:
        return Model(self.graph.ndata["feat"].shape[1], self.hidden, self.num_classes)

    def train_sampler(self) -> Any:
        import dgl

        # DGL's sampler, unchanged; use_ddp=True and set_epoch are replaced by node_dataloader.
        return dgl.dataloading.NeighborSampler(self.fanouts, prefetch_node_feats=["feat"],
                                               prefetch_labels=["label"])


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="tolokers", choices=("tolokers", "ogbn-arxiv", "cora", "citeseer"))
    parser.add_argument("--ogb-root", default=None,
                        help=f"folder holding ogbn_arxiv/ (default ${OGB_ROOT_ENV}, else ./dataset)")
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30,
                        help="DGL's tutorial loops over 10 and breaks after the first")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial02", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="3 epochs: the CI smoke test")
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs = 3

    started = time.time()
    try:
        graph = load_graph(args.dataset, args.ogb_root)
    except OgbFilesMissing as err:
        where = "" if (args.ogb_root or os.environ.get(OGB_ROOT_ENV)) else \
            f" (neither --ogb-root nor ${OGB_ROOT_ENV} was given, so OGB's default root ./dataset was tried)"
        print(f"error: {err}{where}", file=sys.stderr)
        raise SystemExit(2)
    task = MultiGPUNodeClassification(graph, batch_size=args.batch_size, lr=args.lr)
    print(f"{args.dataset}: {graph.num_nodes()} nodes, {graph.num_edges()} edges, "
          f"{graph.ndata['feat'].shape[1]} features, {task.num_classes} classes; train/val/test "
          f"{len(task.split_ids['train'])}/{len(task.split_ids['val'])}/{len(task.split_ids['test'])}; "
          f"{args.num_procs} CPU processes", flush=True)

    monitor = "val_auc" if task.binary else "val_acc"
    ckpt = ModelCheckpoint(monitor=monitor, mode="max", filename="{epoch}-{" + monitor + ":.4f}")
    # DGL's print('Epoch {} Validation Accuracy {}'), on rank 0, with exact values
    # (val_auc only exists for binary datasets: a missing metric is left out of the line).
    show = PrintMetrics(["train_loss", "train_acc", "val_acc", "val_auc"])
    trainer = Trainer(num_procs=args.num_procs, max_epochs=args.epochs, seed=args.seed,
                      default_root_dir=args.root_dir, callbacks=[ckpt, show])
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    test = trainer.test(task, ckpt_path="best")
    auc = f"  test_auc {test['test_auc']:.4f}" if task.binary else ""
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best checkpoint {ckpt.best_model_path} "
          f"({monitor} {ckpt.best_model_score:.4f})")
    print(f"test (best checkpoint, every rank scores its share, {int(test['test_nodes'])} nodes): "
          f"test_acc {test['test_acc']:.4f}{auc}", flush=True)

    last = trainer.history[-1]
    result = {
        "tutorial": "02_multigpu_node_classification", "dataset": args.dataset,
        "num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(), "num_procs": args.num_procs,
        "epochs": trainer.current_epoch, "final_train_loss": last["train_loss"],
        "final_val_acc": last["val_acc"], "val_nodes": int(last["val_nodes"]),
        "monitor": monitor, "best_score": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_nodes": int(test["test_nodes"]),
        "checkpoint": ckpt.best_model_path, "fit_seconds": round(fit_s, 1),
        "seconds": round(time.time() - started, 1),
    }
    if task.binary:
        result.update(final_val_auc=last["val_auc"], test_auc=test["test_auc"])
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()
