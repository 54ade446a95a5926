"""HeteroSAGE on synthetic papers and words, 2 ranks (fork, gloo): two questions, two results names.

    python benchmarks/sparse_embedding.py [--tiny]  # dense per-rank nn.Embedding (SGD) against one shared
    # SparseEmbedding (SparseAdagrad), 5M featureless rows: USS/PSS per rank, median step after --warmup steps
    python benchmarks/sparse_embedding.py --ddp-unused [--steps 20]  # results ddp_unused: per configuration (a
    # fresh interpreter), finished, error, ranks printing DDP's unused-parameter warning, median step after 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import probe
import torch
import torch.nn.functional as F
import workload
from graphtrainer import GraphTask
from graphtrainer import comm as gdist
from graphtrainer.datasets import synthetic_hetero
from graphtrainer.models import HeteroSAGE
from graphtrainer.nn.sparse_embedding import SparseAdagrad, SparseEmbedding

#: --ddp-unused: name -> (seed types, Trainer keyword arguments)
CONFIGS: Dict[str, Any] = {
    f"{seeds} seeds, {option}": (seeds.split("+"), kwargs) for seeds in ("paper+word", "paper")
    for option, kwargs in (("find_unused=False", {}), ("find_unused=True", {"find_unused_parameters": True}),
                           ("static_graph=True", {"ddp_kwargs": {"static_graph": True}}))}


class HeteroSeeds(GraphTask):
    """HeteroSAGE (SGD; hidden as wide as the paper features) on ``seed_types`` seeds; with ``emb``, the
    ``word`` rows come from that shared table (SparseAdagrad), not from a dense embedding."""

    def __init__(self, graph: Any, seed_types: Sequence[str], batch_size: int, embed_dim: int,
                 emb: Optional[SparseEmbedding] = None) -> None:
        super().__init__()
        self.graph, self.batch_size, self.embed_dim, self.emb = graph, batch_size, embed_dim, emb
        self.ids = {nt: torch.arange(graph.num_nodes(nt)) for nt in seed_types}

    def configure_model(self) -> Any:
        g, width = self.graph, self.graph.nodes["paper"].data["feat"].shape[1]
        classes = int(g.nodes["paper"].data["label"].max()) + 1
        return HeteroSAGE(g.canonical_etypes, {nt: g.num_nodes(nt) for nt in g.ntypes}, {"paper": width}, width,
                          classes, dropout=0.0, embed_dim=self.embed_dim,
                          sparse_embeddings=None if self.emb is None else {"word": self.emb})

    def configure_optimizers(self) -> Any:
        dense = torch.optim.SGD(self.model.parameters(), lr=0.1)
        return dense if self.emb is None else [dense, SparseAdagrad([self.emb], lr=0.1)]

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids, [5, 5], self.batch_size)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, out_nodes, blocks = batch
        out = self.model(blocks, {"paper": blocks[0].srcdata["feat"]["paper"]})
        seeds = [nt for nt in out_nodes if out_nodes[nt].numel()]  # a batch may hold one seed type only
        labels = torch.cat([blocks[-1].dstdata["label"][nt] for nt in seeds])
        return F.cross_entropy(torch.cat([out[nt] for nt in seeds]), labels)


def step_times(run: Dict[str, Any]) -> List[float]:
    """Rank 0's step times in a one-epoch :func:`workload.fit` (each from the previous step's end)."""
    ends = run["step_ends_s"][0]
    return [b - a for a, b in zip([0.0] + ends, ends)]


class MemoryTimer(workload.EpochTimer):
    """Also every rank's memory (MB) after its last step, gathered to rank 0."""

    FIELDS = workload.EpochTimer.FIELDS + ("ranks",)
    ranks: List[Dict[str, float]] = []  # replaced on rank 0, never mutated

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        super().on_train_epoch_end(trainer, task)
        self.ranks = gdist.all_gather_object(probe.smaps_rollup(os.getpid()))


def sparse_vs_dense(args: argparse.Namespace) -> Dict[str, Any]:
    graph = synthetic_hetero(args.papers, args.words, avg_degree=5, words_per_paper=5, feat_dim=32, seed=0)
    runs: Dict[str, Dict[str, Any]] = {}
    for mode in ("dense", "sparse"):
        emb = SparseEmbedding(args.words, args.dim, ntype="word", init_std=0.1) if mode == "sparse" else None
        timer = MemoryTimer()
        run = workload.fit(graph, HeteroSeeds(graph, ["paper"], args.batch_size, args.dim, emb), 1, timer,
                           evaluate_test=False, launcher="fork", limit_train_batches=args.steps,
                           find_unused_parameters=True)
        runs[mode] = {"mode": mode, "fit_wall_s": run["run_wall_s"], "steps_per_rank": run["steps_per_epoch"][0],
                      "median_step_s": harness.median(step_times(run)[args.warmup:]),
                      **{k: [r[k] for r in timer.ranks] for k in ("uss_mb", "pss_mb", "rss_mb")},
                      "parent_rss_mb": probe.smaps_rollup(os.getpid())["rss_mb"]}
    dense, sparse = runs["dense"], runs["sparse"]
    ratio = {"median_step_s": sparse["median_step_s"] / dense["median_step_s"],
             "uss_mb_rank0": sparse["uss_mb"][0] / dense["uss_mb"][0],
             "pss_mb_total": sum(sparse["pss_mb"]) / sum(dense["pss_mb"])}
    per_rank = lambda values: " / ".join(f"{v:.0f}" for v in values)  # noqa: E731
    md = (f"# Sparse shared vs dense per-rank embedding: {args.words:,} featureless rows x {args.dim}, "
          f"{args.papers:,} papers, 2 ranks (fork, gloo), batch {args.batch_size}, {args.steps} steps\n\n"
          + harness.markdown_table(
              ["embedding", "median step (s)", "USS rank 0 / 1 (MB)", "PSS rank 0 / 1 (MB)", "fit wall (s)"],
              [[r["mode"], f"{r['median_step_s']:.3f}", per_rank(r["uss_mb"]), per_rank(r["pss_mb"]),
                f"{r['fit_wall_s']:.1f}"] for r in runs.values()])
          + f"\n\nsparse / dense: step time {ratio['median_step_s']:.3f}x, rank-0 USS {ratio['uss_mb_rank0']:.3f}x, "
          f"total PSS {ratio['pss_mb_total']:.3f}x")
    return harness.report(args, {"results": list(runs.values()), "ratios_sparse_over_dense": ratio}, md)


def ddp_config(name: str, steps: int) -> Dict[str, Any]:
    """Configuration ``name`` in a fresh interpreter (``--child``), whose stderr holds DDP's warnings."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--ddp-unused", "--child", name, "--steps", str(steps)],
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line and "Warning" not in line]
    times = json.loads(proc.stdout.splitlines()[-1])[2:] if proc.returncode == 0 else []  # after 2 warm-up steps
    return {"config": name, "finished": proc.returncode == 0, "error": errors[-1][:300] if errors else "",
            "ranks_warning": proc.stderr.count("did not find any unused parameters"),
            "wall_s": time.perf_counter() - start, "median_step_s": harness.median(times) if times else None}


def ddp_unused(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    if args.child:  # fits one configuration, prints rank 0's step times last
        graph = synthetic_hetero(20000, 4000, avg_degree=5, words_per_paper=3, feat_dim=16, num_classes=4)
        graph.nodes["word"].data["label"] = torch.arange(4000) % 4
        types, kwargs = CONFIGS[args.child]
        run = workload.fit(graph, HeteroSeeds(graph, types, 256, embed_dim=16), 1, evaluate_test=False,
                           launcher="fork", limit_train_batches=args.steps, **kwargs)
        print(json.dumps(step_times(run)))
        return None
    rows = [ddp_config(name, args.steps) for name in CONFIGS]
    md = harness.markdown_table(
        ["configuration", "finished", "ranks printing the warning", "median step (s)", "error"],
        [[r["config"], r["finished"], r["ranks_warning"], f"{r['median_step_s']:.4f}" if r["median_step_s"] else "-",
          r["error"]] for r in rows])
    return harness.report(args, {"steps": args.steps, "rows": rows}, md)


def main(argv: Any = None) -> Optional[Dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ddp = "--ddp-unused" in argv  # the results name and the options depend on it
    parser = harness.base_parser("ddp_unused" if ddp else "sparse_embedding", __doc__, tiny={
        "papers": 2_000, "words": 10_000, "batch_size": 128, "steps": 4, "warmup": 1})
    parser.add_argument("--ddp-unused", action="store_true", help="the DDP unused-parameter warning question")
    parser.add_argument("--steps", type=int, default=20 if ddp else 12, help="steps per fit (default %(default)s)")
    if ddp:
        parser.add_argument("--child", help=argparse.SUPPRESS)
    else:
        for flag, default in (("--papers", 1_000_000), ("--words", 5_000_000), ("--dim", 16), ("--batch-size", 512),
                              ("--warmup", 2)):
            parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    return ddp_unused(args) if ddp else sparse_vs_dense(args)


if __name__ == "__main__":
    main()
