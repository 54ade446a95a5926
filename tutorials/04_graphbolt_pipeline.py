"""Tutorial 4: a GraphBolt pipeline (DGL's newer multi-GPU tutorial) inside a GraphTask.

DGL's second-generation data loading, ``dgl.graphbolt``, replaces
``dgl.dataloading.DataLoader`` by a chain of small stages:

    ItemSet / DistributedItemSampler   which seed nodes, split between ranks
      .sample_neighbor(graph, fanouts) sampled blocks (a FusedCSCSamplingGraph)
      .fetch_feature(features, ...)    gather input features from a feature store
      .copy_to(device)                 move the minibatch to the rank's device
    gb.DataLoader(pipeline)            iterate (optionally with worker processes)

and yields ``MiniBatch`` objects (``.blocks``, ``.node_features["feat"]``, ``.labels``).

The data is Cora from the shipped files, written to disk in GraphBolt's on-disk
("built-in") dataset format: a ``metadata.yaml`` plus NumPy files, the layout that
``gb.BuiltinDataset("ogbn-products")`` downloads, then loaded with
``gb.OnDiskDataset(path).load()`` (``tutorials/graphbolt_ondisk.py`` writes it).

Run it
------
Full settings (2 CPU processes, 30 epochs)::

    bash scripts/env.sh python tutorials/04_graphbolt_pipeline.py

Smoke test (3 epochs; ``tests/tutorials/test_tutorial_04.py`` runs it and reads ``summary.json``)::

    bash scripts/env.sh python tutorials/04_graphbolt_pipeline.py --fast --out /tmp/t04

What to look at: ``train_batches_rank0/1`` (3 and 2: uneven ranks, handled by ``Join``),
the exact validation accuracy beside the hand-written mean of per-rank accuracies, and
the test accuracy of the best checkpoint, also recomputed from ``predict()``.

Measured output: ``tutorials/results/04_graphbolt_pipeline.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_04.py``) runs ``--fast`` and checks its figures against
``tutorials/results/04_graphbolt_pipeline.json``.

What the hand-written DGL example does, and what replaces it
-------------------------------------------------------------
DGL's multi-GPU GraphBolt example (``examples/multigpu/graphbolt/node_classification.py``)
writes, per rank:

    dataset = gb.BuiltinDataset("ogbn-products").load()              # (1) data
    mp.spawn(run, args=(world_size, args, devices, dataset), nprocs=world_size)   # (2) launch
    def run(rank, ...):
        torch.cuda.set_device(rank)                                   # (3) device
        dist.init_process_group("nccl", "tcp://127.0.0.1:12345",      # (4) group, fixed port
                                world_size=..., rank=rank)
        model = DDP(SAGE(...).to(device))                             # (5) DDP
        train_loader = gb.DataLoader(gb.DistributedItemSampler(       # (6) pipeline
            train_set, 1024, shuffle=True).sample_neighbor(graph, fanout)
            .fetch_feature(features, ["feat"]).copy_to(device))
        for epoch in ...:
            with Join([model]):                                       # (7) uneven inputs
                for data in train_loader: ...forward, backward, step...
            acc = evaluate(model, valid_loader) / world_size          # (8) metrics:
            dist.reduce(acc, dst=0)                                   #     mean of rank means
            dist.barrier()
        # (9) no checkpoint; test accuracy reduced the same way

With graphtrainer, (2)-(5), (7) and (8) are ``Trainer(num_procs=2).fit(task)``: it forks
the ranks (the loaded dataset is shared copy-on-write), picks a free port, sets the
device, wraps the model in DDP, runs each epoch inside ``Join`` and reduces metrics
exactly; ``ModelCheckpoint`` adds (9). The task below keeps only (1) and (6): it builds
the same GraphBolt pipeline in ``train_dataloader``/``val_dataloader``. Two things get
better than the hand-written version:

* **Exact metrics.** ``dist.reduce(acc / world_size)`` averages per-rank accuracies,
  which is wrong whenever the ranks score different numbers of nodes (Cora's 500
  validation nodes split 256/244 with batch size 128). Here every ``self.log`` passes
  ``batch_size=n``; the trainer sums value*n and n over all batches of all ranks, in
  float64, after leaving ``Join``. The script prints both numbers so you can see the
  difference (small here, since the shares are nearly equal).
* **A fresh split every epoch.** See the next section.

``Join`` really is needed: ``DistributedItemSampler`` gives rank r a chunk whose length
is rounded to whole batches, so Cora's 140 training nodes with batch size 32 split 76/64,
i.e. 3 batches on rank 0 and 2 on rank 1. Without ``Join`` rank 0's third backward would
wait forever for an all-reduce rank 1 never joins. The script logs each rank's batch
count (``train_batches_rank0/1``). ``Join`` alone is not quite enough either: DDP's join
hook gives the early rank the final parameters but not the optimizer's state (Adam's
moments, its step count), which in the hand-written loop then drift apart between
ranks; after ``Join`` the trainer copies them from the rank that stepped last.

What GraphBolt in DGL 2.1.0 cannot do here, and the closest working form
-------------------------------------------------------------------------
1. **No per-epoch reshuffle across ranks, no seed.** ``DistributedItemSampler`` cuts the
   item set into the same contiguous per-rank chunk every epoch and, with
   ``shuffle=True``, only shuffles *inside* that chunk, with an unseeded
   ``np.random.default_rng()`` (so runs are not reproducible); it has no ``set_epoch``
   and no ``seed`` argument. Closest working form: :class:`EpochShuffledLoader` permutes
   the items identically on every rank from ``(seed, epoch)``, then hands the permuted
   ``ItemSet`` to ``DistributedItemSampler(shuffle=False)``; the trainer calls its
   ``set_epoch`` before each epoch. Every item is still seen once per epoch.
2. **It cannot be built before the ranks exist.** Its constructor reads
   ``dist.get_world_size()``/``get_rank()``, so it fails in the launching process
   (no process group). :class:`EpochShuffledLoader` builds it lazily in ``__iter__``,
   i.e. inside the rank.
3. **``dgl.seed`` does not reach GraphBolt.** GraphBolt's neighbour sampler has its own
   generator (``gb.seed``), so a hand-written loop that calls only ``dgl.seed`` samples
   differently on every run. The trainer seeds it too: each epoch, before
   ``on_train_epoch_start``, it calls ``gb.seed`` (when ``dgl.graphbolt`` is imported)
   along with torch, NumPy, ``random`` and ``dgl.seed``, from ``(seed, rank, epoch)``.
   The task does nothing for it: two runs print the same numbers (measured in the
   results file, below).
4. **GPUs need DGL's CUDA build.** The PyPI ``dgl`` wheel is CPU-only: blocks on a GPU
   raise ``DGLError: Device API cuda is not enabled``, and its GraphBolt library holds no
   CUDA code (no GPU sampling or GPU feature fetching); see docs/gpus.md.
   On CPU ``copy_to(self.device)`` is a no-op, and the same task runs unchanged with
   ``Trainer(gpus=N)`` on the CUDA build. Its ranks are forked: if the parent has already
   used CUDA (``torch.cuda.is_available()`` counts unless
   ``PYTORCH_NVML_BASED_CUDA_CHECK=1``; ``torch.cuda.device_count()`` is fork-safe), the
   trainer spawns them instead, with a warning (``launcher="fork"`` raises).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import GraphTask, ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402
from tutorials.graphbolt_ondisk import write_ondisk_dataset  # noqa: E402  (1: Cora on disk)
from tutorials.summary import write_summary  # noqa: E402


# ---------------------------------------------------------------------------------------
# 1. A loader the trainer can re-split every epoch.
# ---------------------------------------------------------------------------------------
class EpochShuffledLoader:
    """A GraphBolt pipeline over ``item_set``, rebuilt each epoch on a new global order.

    DGL 2.1's ``DistributedItemSampler`` gives rank r the r-th contiguous chunk of the
    item set, every epoch. Permuting the items first with a generator seeded from
    ``(seed, epoch)`` (the same permutation on every rank) makes the chunks, and so each
    rank's share, different every epoch while still covering every item exactly once.
    The trainer finds :meth:`set_epoch` on the loader and calls it before each epoch.

    ``shuffle=False`` keeps the given order and no permutation: use it for evaluation,
    where each rank gets a disjoint contiguous chunk (every item exactly once overall).
    """

    def __init__(self, item_set: Any, make_pipeline: Callable[[Any], Any], batch_size: int,
                 shuffle: bool, seed: int = 0):
        self.item_set, self.make_pipeline = item_set, make_pipeline
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _items(self) -> Any:
        import dgl.graphbolt as gb

        if not self.shuffle:
            return self.item_set
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.item_set), generator=gen)
        columns = self.item_set[order]              # a tuple (seed_nodes, labels)
        return gb.ItemSet(tuple(columns), names=self.item_set.names)

    def __iter__(self):
        import dgl.graphbolt as gb
        import torch.distributed as dist

        items = self._items()
        if dist.is_available() and dist.is_initialized():
            # Needs the process group: build it in the rank (here, in __iter__), never
            # in the launching process. drop_uneven_inputs=False: the trainer's Join
            # handles ranks with fewer batches, and nothing is dropped.
            # shuffle=False: the order is already random (and reproducible); GraphBolt's own
            # shuffle draws from an unseeded NumPy generator.
            sampler = gb.DistributedItemSampler(items, batch_size=self.batch_size, shuffle=False,
                                                drop_last=False, drop_uneven_inputs=False)
        else:  # Trainer(num_procs=1): no process group, one rank sees everything
            sampler = gb.ItemSampler(items, batch_size=self.batch_size, shuffle=False)
        return iter(gb.DataLoader(self.make_pipeline(sampler), num_workers=0))


# ---------------------------------------------------------------------------------------
# 2. The task.
# ---------------------------------------------------------------------------------------
class GraphBoltNodeClassification(GraphTask):
    """GraphSAGE on a GraphBolt dataset; batches are ``gb.MiniBatch`` objects."""

    def __init__(self, dataset: Any, fanouts: Sequence[int] = (10, 10), hidden: int = 256,
                 lr: float = 1e-2, weight_decay: float = 5e-4, dropout: float = 0.5,
                 batch_size: int = 32, eval_batch_size: int = 128):
        super().__init__()
        self.save_hyperparameters("fanouts", "hidden", "lr", "weight_decay", "dropout", "batch_size")
        self.dataset = dataset                     # graph + feature store, shared by fork
        self.fanouts, self.hidden, self.lr = list(fanouts), hidden, lr
        self.weight_decay, self.dropout = weight_decay, dropout
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        task = dataset.tasks[0]
        self.num_classes = int(task.metadata["num_classes"])
        self.in_feats = dataset.feature.size("node", None, "feat")[0]
        self._eval_counts: List[torch.Tensor] = []  # per-rank (correct, seen) for the naive mean
        self._train_batches = 0                    # this rank's batches this epoch (uneven!)

    def configure_model(self) -> torch.nn.Module:
        return SAGE(self.in_feats, self.hidden, self.num_classes, num_layers=len(self.fanouts),
                    dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    # The GraphBolt pipeline: sampler -> sample_neighbor -> fetch_feature -> copy_to.
    def _pipeline(self, fanouts: Sequence[int]) -> Callable[[Any], Any]:
        graph, features, device = self.dataset.graph, self.dataset.feature, self.device

        def build(sampler: Any) -> Any:
            pipe = sampler.sample_neighbor(graph, list(fanouts))
            pipe = pipe.fetch_feature(features, node_feature_keys=["feat"])
            return pipe.copy_to(device)
        return build

    def train_dataloader(self) -> Any:
        return EpochShuffledLoader(self.dataset.tasks[0].train_set, self._pipeline(self.fanouts),
                                   self.batch_size, shuffle=True, seed=self.trainer.seed)

    def _eval_loader(self, item_set: Any) -> Any:
        # Fanout -1 takes every neighbour: exact, deterministic evaluation.
        return EpochShuffledLoader(item_set, self._pipeline([-1] * len(self.fanouts)),
                                   self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader(self.dataset.tasks[0].validation_set)

    def test_dataloader(self) -> Any:
        return self._eval_loader(self.dataset.tasks[0].test_set)

    def predict_dataloader(self) -> Any:
        return self._eval_loader(self.dataset.tasks[0].test_set)

    def _forward(self, mb: Any) -> torch.Tensor:
        return self.model(mb.blocks, mb.node_features["feat"])

    def on_train_epoch_start(self) -> None:
        # No seeding here: before this hook the trainer seeds torch, NumPy, random, DGL and
        # GraphBolt's own sampler generator (gb.seed) from (seed, rank, epoch).
        self._train_batches = 0

    def training_step(self, mb: Any, batch_idx: int) -> torch.Tensor:
        self._train_batches += 1
        logits = self._forward(mb)
        labels = mb.labels.long()
        loss = F.cross_entropy(logits, labels)
        n = labels.numel()                         # a MiniBatch's size is not inferred: pass it
        self.log("train_loss", loss, batch_size=n, prog_bar=True)
        self.log("train_acc", (logits.argmax(-1) == labels).float().mean(), batch_size=n)
        return loss

    def _eval_step(self, mb: Any, prefix: str) -> None:
        logits = self._forward(mb)
        labels = mb.labels.long()
        correct = (logits.argmax(-1) == labels).float()
        n = labels.numel()
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels), batch_size=n)
        self.log(f"{prefix}_acc", correct.mean(), batch_size=n)
        self._eval_counts.append(torch.tensor([[correct.sum().item(), float(n)]], dtype=torch.float64))

    def _check_exact(self, prefix: str, item_set: Any) -> None:
        """Every item scored once across ranks; log the hand-written example's naive mean too."""
        local = torch.cat(self._eval_counts).sum(0, keepdim=True) if self._eval_counts \
            else torch.zeros(1, 2, dtype=torch.float64)
        self._eval_counts = []
        per_rank = self.all_gather(local)          # one (correct, seen) row per rank
        seen = int(per_rank[:, 1].sum())
        if seen != len(item_set):
            raise RuntimeError(f"{prefix}: {seen} nodes scored for {len(item_set)} items")
        naive = float((per_rank[:, 0] / per_rank[:, 1].clamp_min(1)).mean())
        self.log(f"{prefix}_acc_mean_of_rank_means", naive, batch_size=1)
        self.log(f"{prefix}_nodes_scored", float(seen), batch_size=1)

    def on_train_epoch_end(self) -> None:
        # Outside Join now, so a collective is allowed: show how uneven the ranks were.
        counts = self.all_gather(torch.tensor([self._train_batches]))
        for r, n in enumerate(counts.tolist()):
            self.log(f"train_batches_rank{r}", float(n), batch_size=1)

    def validation_step(self, mb: Any, batch_idx: int) -> None:
        self._eval_step(mb, "val")

    def on_validation_epoch_end(self) -> None:
        self._check_exact("val", self.dataset.tasks[0].validation_set)

    def test_step(self, mb: Any, batch_idx: int) -> None:
        self._eval_step(mb, "test")

    def on_test_epoch_end(self) -> None:
        self._check_exact("test", self.dataset.tasks[0].test_set)

    def predict_step(self, mb: Any, batch_idx: int) -> torch.Tensor:
        return torch.softmax(self._forward(mb), dim=-1)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/tutorial04",
                        help="where runs, checkpoints, the on-disk dataset and summary.json go")
    parser.add_argument("--root-dir", default=None, help="run folders and checkpoints (default: --out)")
    parser.add_argument("--fast", action="store_true", help="3 epochs: a smoke test in seconds")
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs = 3

    import dgl.graphbolt as gb
    from graphtrainer import datasets

    out = Path(args.out)
    started = time.time()
    # (1) Shipped Cora -> GraphBolt's on-disk format -> OnDiskDataset (graph, features, task sets).
    directory = write_ondisk_dataset(datasets.load("cora"), out / "graphbolt_cora")
    dataset = gb.OnDiskDataset(str(directory)).load()
    print(f"GraphBolt dataset at {directory}: {dataset.graph.total_num_nodes} nodes, "
          f"{dataset.graph.total_num_edges} edges; train/val/test "
          f"{len(dataset.tasks[0].train_set)}/{len(dataset.tasks[0].validation_set)}/"
          f"{len(dataset.tasks[0].test_set)}", flush=True)

    # (6) lives in the task; (2)-(5), (7), (8) in the Trainer; (9) is ModelCheckpoint.
    task = GraphBoltNodeClassification(dataset, fanouts=[int(f) for f in args.fanouts.split(",")],
                                       batch_size=args.batch_size)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    # "train_batches_rank*": how many batches each rank trained (this task logs one per rank).
    show = PrintMetrics(["train_loss", "val_loss", "val_acc", "train_batches_rank*"],
                        formats={"train_batches_rank*": ".0f"})
    trainer = Trainer(num_procs=args.num_procs, max_epochs=args.epochs, seed=args.seed,
                      default_root_dir=Path(args.root_dir or out), callbacks=[ckpt, show],
                      progress_bar=False)
    trainer.fit(task)
    last = trainer.history[-1]
    print(f"validation, last epoch: exact val_acc {last['val_acc']:.4f} over {int(last['val_nodes_scored'])} "
          f"nodes; mean of per-rank accuracies (the hand-written reduction) "
          f"{last['val_acc_mean_of_rank_means']:.4f}")

    test = trainer.test(task, ckpt_path="best")
    probs = trainer.predict(task, ckpt_path="best")
    # DistributedItemSampler's evaluation chunks are contiguous and the trainer concatenates
    # rank outputs in rank order, so the predictions come back in the test set's order.
    labels = dataset.tasks[0].test_set[:][1].long()
    pred_acc = float((probs.argmax(-1) == labels).float().mean())
    batches = [int(last[k]) for k in sorted(last) if k.startswith("train_batches_rank")]
    summary = {
        "tutorial": "04_graphbolt_pipeline", "num_procs": args.num_procs, "epochs": trainer.current_epoch,
        "num_classes": task.num_classes,
        "train_loss_first": trainer.history[0]["train_loss"], "train_loss_last": last["train_loss"],
        "train_batches_per_rank": batches,
        "val_acc_last": last["val_acc"], "val_nodes_scored": int(last["val_nodes_scored"]),
        "val_acc_mean_of_rank_means_last": last["val_acc_mean_of_rank_means"],
        "best_val_acc": ckpt.best_model_score, "test_acc": test["test_acc"], "test_loss": test["test_loss"],
        "test_nodes_scored": int(test["test_nodes_scored"]),
        "test_acc_mean_of_rank_means": test["test_acc_mean_of_rank_means"],
        "test_acc_from_predictions": pred_acc, "predictions_shape": list(probs.shape),
        "checkpoint": ckpt.best_model_path, "log_dir": str(trainer.log_dir),
        "seconds": round(time.time() - started, 1),
    }
    print(f"best checkpoint {ckpt.best_model_path} (val_acc {ckpt.best_model_score:.4f})")
    print(f"test_acc {test['test_acc']:.4f} (exact, {int(test['test_nodes_scored'])} nodes; "
          f"mean of per-rank accuracies {test['test_acc_mean_of_rank_means']:.4f}); "
          f"from predict(): {pred_acc:.4f}")
    path = write_summary(args.out, summary)
    print(f"summary written to {path} ({summary['seconds']} s)", flush=True)
    return summary


if __name__ == "__main__":
    main()
