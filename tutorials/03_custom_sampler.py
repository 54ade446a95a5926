"""Tutorial 3: a custom neighbourhood sampler (a ``BlockSampler`` with its own ``sample_frontier``),
and how the graph it samples from is shared between processes (fork, copy-on-write, the
sparse formats built before the fork).

DGL's "Customizing neighborhood sampler" guide (section 6.4 of the DGL 0.7 user guide)
subclasses ``dgl.dataloading.BlockSampler`` and writes one method,
``sample_frontier(block_id, g, seed_nodes)``: which in-edges of the seed nodes layer
``block_id`` keeps. DGL's multi-GPU node classification tutorial trains in forked
processes, calling ``graph.create_formats_()`` first. Here such a sampler is plugged into a
``GraphTask`` with ``self.node_dataloader(ids, sampler, batch_size)``; the trainer does the
forking, the format building (only CSC, which in-edge sampling reads) and the per-rank
split of the seed nodes.

Run it (2 CPU processes, a 100,000-node synthetic graph):

    bash scripts/env.sh python tutorials/03_custom_sampler.py

What to look at: the mean degree of the neighbours each sampler picks (the weighted one
about halves it), the graph's formats before and after ``fit`` (the trainer built CSC
before the fork), and the memory (PSS, USS, RSS) of each process at the end of ``fit``.
``--fast`` runs a 20,000-node graph for 3 epochs.

Measured output: ``tutorials/results/03_custom_sampler.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_03.py``) runs ``--fast`` and checks its figures against
``tutorials/results/03_custom_sampler.json``.

The sampler
-----------
:class:`WeightedFanoutSampler` keeps, for each seed node and layer, at most ``fanout``
distinct in-edges (sampling *without replacement*), drawn with probability proportional
to the edge weight ``g.edata["w"]``, via ``dgl.sampling.sample_neighbors(..., prob="w",
replace=False)``. The weight here is ``1 / degree`` of the neighbour: the synthetic
graph has a heavy-tailed degree distribution (mean degree 10), and a uniformly drawn
neighbour is most likely a hub (see the mean degrees in the results file). The script
prints the mean degree of the sampled neighbours under both samplers to show the bias
at work. It is an example weight: put your own in ``g.edata["w"]`` (an interaction
count, a recency, a similarity).

DGL 0.7's ``BlockSampler`` called ``sample_frontier`` for you; since DGL 0.8 (2.1 here) the
base class only asks for ``sample_blocks``, so the sampler writes that loop itself in
six lines: frontier -> ``dgl.to_block`` -> its source nodes are the next layer's seeds.
``prefetch_node_feats``/``prefetch_labels`` (``BlockSampler.__init__``) make the blocks
carry ``feat`` and ``label`` as in DGL's own samplers.

Fork, copy-on-write and the sparse formats
------------------------------------------
On Linux, ``Trainer(num_procs=N)`` *forks* its ranks (``launcher="fork"``, the default):
each child starts with the parent's memory mapped, not copied. A page is copied only
when someone writes to it (copy-on-write), so a graph that every rank only reads is held
once, whatever N is. Two things break that:

* **Formats built after the fork.** A DGL graph stores its structure as COO, CSR and/or
  CSC, and builds a missing one the first time an operation needs it (in-edge sampling
  needs CSC; ``in_degrees`` too). Built in a child, it is private to that child: every
  rank pays for its own copy. ``graph.create_formats_()`` in the parent builds all
  three before the fork, so they are shared; the trainer builds only those the samplers
  read (CSC here, about 340 MB less than all three at 2M nodes / 20M edges) for every
  graph it finds on the task (``task.graph`` here), and a task that needs more says so
  with ``graph_formats = ("csc", "csr")``. The script prints ``graph.formats()`` before
  and after ``fit`` so you can see it happen.
* **spawn.** ``launcher="spawn"`` starts fresh interpreters (needed on macOS/Windows,
  or after CUDA was used in the parent). A hand-written ``mp.spawn(run, args=(graph,))``
  pickles the graph into every child: N private copies. graphtrainer's spawn launcher
  moves the structure and every node/edge tensor to shared memory once instead, in place
  (the parent keeps no private copy), and the ranks attach to it. ``launcher="forkserver"``
  does the same for the graph but forks the ranks from a clean server that imported torch
  and dgl once, so they share those pages instead of importing them each. With GPUs, a forked rank cannot use CUDA if the parent already
  has (``torch.cuda.is_available()`` counts, unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``;
  ``torch.cuda.device_count()`` is fork-safe): ``launcher="auto"`` then uses the fork
  server, with a warning, and ``launcher="fork"`` raises a clear error. The same happens, CPU ranks
  included, on a machine with GPUs when the parent ran a backward pass before ``fit``
  (autograd's per-device threads do not survive a fork).

How much it matters at scale was measured on the pinned stack for a 2,000,000-node,
20,000,000-edge graph (the table is in ``tutorials/results/03_custom_sampler.txt``):
fork after ``create_formats_()`` holds the graph once; without it each rank builds its own
CSC; a hand-written spawn pickles the graph into every child. The fork-vs-spawn benchmark
(``benchmarks/fork_vs_spawn.py``) makes the comparison systematically. This script with
``--nodes 2000000 --avg-degree 10 --feat-dim 64`` builds a graph of that size, and its
``MemoryReport`` callback prints the PSS, USS (private memory) and RSS of each rank and of
the launching process at the end of ``fit``, so you can compare launchers on your own
graph (``--launcher fork|spawn|forkserver``).

The classic hand-written workflow, and what replaces it
-------------------------------------------------------
1. ``class Sampler(BlockSampler): sample_frontier(...)``      -> the same class, below.
2. ``graph.create_formats_()`` before starting processes       -> done by the trainer (the
                                                                  formats the samplers read).
3. ``dgl.multiprocessing.Process(target=run, args=(rank, ...))`` per device, each calling
   ``init_process_group``, wrapping the model in DDP, building
   ``DataLoader(graph, ids, sampler, use_ddp=True)``            -> ``Trainer(num_procs=2)``
                                                                  and ``node_dataloader``.
4. Per-rank evaluation and reduction, checkpoint on rank 0     -> ``validation_step``,
                                                                  ``ModelCheckpoint``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import Callback, ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402
from tutorials.summary import report  # noqa: E402

import dgl  # noqa: E402


# ---------------------------------------------------------------------------------------
# 1. The custom sampler.
# ---------------------------------------------------------------------------------------
class WeightedFanoutSampler(dgl.dataloading.BlockSampler):
    """At most ``fanouts[l]`` distinct in-neighbours per seed in layer ``l``, drawn with
    probability proportional to ``g.edata[weight]`` (uniformly when ``weight`` is None).

    ``fanouts`` lists layers from input to output, as in ``NeighborSampler``.
    """

    def __init__(self, fanouts: Sequence[int], weight: Optional[str] = "w", replace: bool = False,
                 prefetch_node_feats: Sequence[str] = ("feat",), prefetch_labels: Sequence[str] = ("label",)):
        super().__init__(prefetch_node_feats=list(prefetch_node_feats), prefetch_labels=list(prefetch_labels))
        self.fanouts, self.weight, self.replace = list(fanouts), weight, replace

    def sample_frontier(self, block_id: int, g: Any, seed_nodes: torch.Tensor,
                        exclude_eids: Any = None) -> Any:
        """The edges layer ``block_id`` aggregates over: a graph on all of ``g``'s nodes
        holding the chosen in-edges of ``seed_nodes`` (``edata[dgl.EID]``: their ids in ``g``)."""
        return dgl.sampling.sample_neighbors(
            g, seed_nodes, self.fanouts[block_id], prob=self.weight, replace=self.replace,
            exclude_edges=exclude_eids)

    def sample_blocks(self, g: Any, seed_nodes: torch.Tensor, exclude_eids: Any = None) -> tuple:
        """What DGL 0.7's BlockSampler did around ``sample_frontier``: output layer first."""
        output_nodes, blocks = seed_nodes, []
        for block_id in reversed(range(len(self.fanouts))):
            frontier = self.sample_frontier(block_id, g, seed_nodes, exclude_eids)
            block = dgl.to_block(frontier, seed_nodes)        # seeds first among its src nodes
            block.edata[dgl.EID] = frontier.edata[dgl.EID]
            seed_nodes = block.srcdata[dgl.NID]                 # the next (lower) layer's seeds
            blocks.insert(0, block)
        return seed_nodes, output_nodes, blocks


def inverse_degree_weights(graph: Any) -> torch.Tensor:
    """``1 / degree(u)`` for every edge ``u -> v``: prefer low-degree neighbours.

    Counted with ``bincount`` on the edge list, so no CSR/CSC format is built here (the
    script shows which formats exist before the trainer builds them).
    """
    src, _ = graph.edges()
    degree = torch.bincount(src, minlength=graph.num_nodes()).clamp_min(1)
    return 1.0 / degree[src].float()


# ---------------------------------------------------------------------------------------
# 2. The task: the sampler goes into node_dataloader.
# ---------------------------------------------------------------------------------------
class CustomSamplerTask(NodeClassification):
    """The example's node-classification task (``graphtrainer/examples/node_classification.py``:
    model, steps, exact evaluation with every neighbour) with this sampler for training."""

    def __init__(self, graph: Any, fanouts: Sequence[int] = (5, 5), sampler: str = "weighted",
                 hidden: int = 128, lr: float = 3e-3, batch_size: int = 512, eval_batch_size: int = 4096):
        # self.graph is found by the trainer: the formats its samplers read, then fork.
        super().__init__(graph, fanouts=fanouts, hidden=hidden, dropout=0.2, lr=lr,
                         batch_size=batch_size, eval_batch_size=eval_batch_size)
        self.save_hyperparameters("sampler")
        self.sampler = sampler

    def train_sampler(self) -> WeightedFanoutSampler:
        # Any DGL block sampler works here: node_dataloader gives it this rank's share of
        # the ids, new every epoch.
        return WeightedFanoutSampler(self.fanouts, weight="w" if self.sampler == "weighted" else None)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        # How many distinct input nodes this batch needed (averaged over batches and ranks).
        self.log("input_nodes", float(batch[0].numel()), batch_size=1)
        return loss


# ---------------------------------------------------------------------------------------
# 3. A callback: each process's memory at the end of fit.
# ---------------------------------------------------------------------------------------
def _memory_mb(pid: Optional[int] = None) -> List[float]:
    import psutil

    info = psutil.Process(pid).memory_full_info()          # reads /proc/<pid>/smaps
    return [info.pss / 2**20, info.uss / 2**20, info.rss / 2**20]


class MemoryReport(Callback):
    """PSS/USS/RSS of every rank, and of the launching process, at the end of ``fit``.

    Runs on every rank (the gather is a collective); the numbers travel back to the
    launching process in this callback's state, like ``ModelCheckpoint``'s best path.
    """

    def __init__(self, launcher_pid: int) -> None:
        self.launcher_pid = launcher_pid         # the process that called fit
        self.rows: List[List[float]] = []        # [pss, uss, rss] per rank, then the launcher

    def state_dict(self) -> Dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.rows = state.get("rows", [])

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        own = torch.tensor([_memory_mb()], dtype=torch.float64)
        rows = task.all_gather(own).tolist()                   # one row per rank
        if trainer.rank == 0 and os.getpid() != self.launcher_pid:   # ranks were launched
            rows.append(_memory_mb(self.launcher_pid))
        self.rows = rows


def sampled_neighbour_stats(graph: Any, seeds: torch.Tensor, fanout: int) -> Dict[str, float]:
    """One layer of sampling for ``seeds``, uniform vs weighted: checks and mean degrees."""
    dgl.seed(0)
    src_all, _ = graph.edges()
    degree = torch.bincount(src_all, minlength=graph.num_nodes()).float()
    out: Dict[str, float] = {"mean_degree_all_edges": float(degree[src_all].mean())}
    for name, weight in (("uniform", None), ("weighted", "w")):
        frontier = WeightedFanoutSampler([fanout], weight=weight).sample_frontier(0, graph, seeds)
        eids = frontier.edata[dgl.EID]
        per_seed = frontier.in_degrees(seeds)
        assert int(per_seed.max()) <= fanout, "more in-edges than the fanout"
        assert eids.unique().numel() == eids.numel(), "an edge was drawn twice"
        src, _ = frontier.edges()
        out[f"{name}_mean_neighbour_degree"] = float(degree[src].mean())
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--sampler", choices=("weighted", "uniform"), default="weighted")
    parser.add_argument("--fanouts", default="5,5")
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--launcher", choices=("auto", "fork", "spawn", "forkserver"), default="auto")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial03", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="20,000 nodes, 3 epochs: the CI smoke test")
    args = parser.parse_args(argv)
    if args.fast:
        args.nodes, args.epochs = 20_000, 3

    from graphtrainer import datasets

    started = time.time()
    # 10 % train, 5 % validation, the rest test (scored exactly, with every neighbour).
    graph = datasets.synthetic(args.nodes, args.avg_degree, args.feat_dim, args.classes,
                               seed=args.seed, train_frac=0.1, val_frac=0.05)
    graph.edata["w"] = inverse_degree_weights(graph)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    task = CustomSamplerTask(graph, fanouts=fanouts, sampler=args.sampler)
    print(f"synthetic graph: {graph.num_nodes()} nodes, {graph.num_edges()} edges, {args.feat_dim}-dim "
          f"features, {task.num_classes} classes; train/val/test {len(task.split_ids['train'])}/"
          f"{len(task.split_ids['val'])}/{len(task.split_ids['test'])}; {args.sampler} sampler, fanouts {fanouts}",
          flush=True)
    formats_before = graph.formats()
    print(f"graph formats before fit: {formats_before}", flush=True)

    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    memory = MemoryReport(launcher_pid=os.getpid())
    show = PrintMetrics(["train_loss", "train_acc", "val_acc", "input_nodes"], formats={"input_nodes": ".0f"})
    trainer = Trainer(num_procs=args.num_procs, launcher=args.launcher, max_epochs=args.epochs,
                      seed=args.seed, default_root_dir=args.root_dir,
                      callbacks=[ckpt, show, memory], progress_bar=False)
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    formats_after = graph.formats()
    print(f"graph formats after fit (the trainer built what the samplers read before launching): "
          f"{formats_after}", flush=True)
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best checkpoint {ckpt.best_model_path} "
          f"(val_acc {ckpt.best_model_score:.4f})", flush=True)
    names = [f"rank {r}" for r in range(args.num_procs)] + (["launcher"] if len(memory.rows) > args.num_procs else [])
    for name, (pss, uss, rss) in zip(names, memory.rows):
        print(f"memory at end of fit, {name:8s}: PSS {pss:7.1f} MB  USS {uss:7.1f} MB  RSS {rss:7.1f} MB")
    total_pss = sum(row[0] for row in memory.rows)
    print(f"memory at end of fit, total PSS of all {len(memory.rows)} processes: {total_pss:.1f} MB "
          f"({args.launcher} launcher)", flush=True)

    stats = sampled_neighbour_stats(graph, task.split_ids["train"][:2000], fanouts[-1])
    print(f"one layer for 2000 training seeds, fanout {fanouts[-1]}: mean degree of sampled "
          f"neighbours: uniform {stats['uniform_mean_neighbour_degree']:.1f}, weighted (1/degree) "
          f"{stats['weighted_mean_neighbour_degree']:.1f}; over all edges "
          f"{stats['mean_degree_all_edges']:.1f}", flush=True)

    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {int(test['test_nodes'])} nodes, exact over {args.num_procs} ranks): "
          f"test_acc {test['test_acc']:.4f}  (chance {1 / task.num_classes:.3f})", flush=True)

    last = trainer.history[-1]
    result = {
        "tutorial": "03_custom_sampler", "sampler": args.sampler, "fanouts": fanouts,
        "num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(), "num_classes": task.num_classes,
        "num_procs": args.num_procs, "launcher": args.launcher, "epochs": trainer.current_epoch,
        "final_train_loss": last["train_loss"], "final_val_acc": last["val_acc"],
        "input_nodes_per_batch": last["input_nodes"], "best_val_acc": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_nodes": int(test["test_nodes"]), "checkpoint": ckpt.best_model_path,
        "formats_before_fit": formats_before, "formats_after_fit": formats_after,
        "memory_mb": {name: dict(zip(("pss", "uss", "rss"), row)) for name, row in zip(names, memory.rows)},
        "total_pss_mb": total_pss, "sampling": stats,
        "fit_seconds": round(fit_s, 1), "seconds": round(time.time() - started, 1),
    }
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()
