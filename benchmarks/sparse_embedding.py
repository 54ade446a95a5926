"""Dense per-rank ``nn.Embedding`` against one shared ``SparseEmbedding`` for a 5M-row
featureless node type: memory per rank and time per training step, 2 ranks (fork, gloo).

    python benchmarks/sparse_embedding.py          # full run
    python benchmarks/sparse_embedding.py --tiny   # seconds (smoke test)

HeteroSAGE on ``synthetic_hetero``'s paper seeds; ``word`` rows from a dense DDP embedding
(SGD) or a shared table (``SparseAdagrad``). Each rank records USS/PSS after its last step and
every step's wall time (the first ``--warmup`` left out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import psutil
import torch
import torch.nn.functional as F

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer import Callback, GraphTask, Trainer
from graphtrainer.datasets import synthetic_hetero
from graphtrainer.models import HeteroSAGE
from graphtrainer.nn.sparse_embedding import SparseAdagrad, SparseEmbedding


class Probe(Callback):
    """Each rank: step wall times and, after the last step, its memory (to ``out``)."""

    def __init__(self, out: str):
        self.out, self.times, self._t = out, [], 0.0

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()  # from the last step's end: sampling, forward, backward, step
        self.times.append(now - self._t)
        self._t = now

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        mem = psutil.Process().memory_full_info()
        with open(os.path.join(self.out, f"rank{trainer.rank}.json"), "w") as fh:
            json.dump({"uss_mb": mem.uss / 2**20, "pss_mb": mem.pss / 2**20, "rss_mb": mem.rss / 2**20,
                       "step_s": self.times}, fh)


class WordTask(GraphTask):
    """Paper classification; ``word`` rows from a dense or a sparse shared embedding."""

    def __init__(self, graph: Any, mode: str, dim: int, batch_size: int):
        super().__init__()
        self.graph, self.mode, self.dim, self.batch_size = graph, mode, dim, batch_size
        self.ids = {"paper": torch.arange(graph.num_nodes("paper"))}
        self.emb = SparseEmbedding(graph.num_nodes("word"), dim, ntype="word", init_std=0.1) if mode == "sparse" else None

    def configure_model(self) -> Any:
        g = self.graph
        return HeteroSAGE(g.canonical_etypes, {nt: g.num_nodes(nt) for nt in g.ntypes},
                          {"paper": g.nodes["paper"].data["feat"].shape[1]}, 32, 8, dropout=0.0,
                          embed_dim=self.dim, sparse_embeddings={"word": self.emb} if self.emb is not None else None)

    def configure_optimizers(self) -> Any:
        dense = torch.optim.SGD(self.model.parameters(), lr=0.1)
        return [dense, SparseAdagrad([self.emb], lr=0.1)] if self.emb is not None else dense

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids, [5, 5], self.batch_size)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, out_nodes, blocks = batch
        out = self.model(blocks, {"paper": blocks[0].srcdata["feat"]["paper"]})
        loss = F.cross_entropy(out["paper"], blocks[-1].dstdata["label"]["paper"])
        self.log("train_loss", loss)
        return loss


def run(graph: Any, mode: str, args: argparse.Namespace, out: Path) -> Dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    task = WordTask(graph, mode, args.dim, args.batch_size)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, limit_train_batches=args.steps, logger=False,
                      progress_bar=False, find_unused_parameters=True,
                      default_root_dir=str(out / "runs"), callbacks=[Probe(str(out))])
    start = time.perf_counter()
    trainer.fit(task)
    wall = time.perf_counter() - start
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    steps = [t for r in ranks for t in r["step_s"][args.warmup:]]
    return {"mode": mode, "fit_wall_s": wall, "median_step_s": statistics.median(steps),
            "steps_per_rank": len(ranks[0]["step_s"]),
            "uss_mb": [r["uss_mb"] for r in ranks], "pss_mb": [r["pss_mb"] for r in ranks],
            "rss_mb": [r["rss_mb"] for r in ranks],
            "parent_rss_mb": psutil.Process().memory_info().rss / 2**20}


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("sparse_embedding", __doc__)
    parser.add_argument("--papers", type=int, default=1_000_000)
    parser.add_argument("--words", type=int, default=5_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    if args.tiny:
        args.papers, args.words, args.batch_size, args.steps, args.warmup = 2_000, 10_000, 128, 4, 1
    graph = synthetic_hetero(args.papers, args.words, avg_degree=5, words_per_paper=5, feat_dim=32, seed=0)
    with tempfile.TemporaryDirectory(prefix="sparse-embedding-") as tmp:
        dense, sparse = results = [run(graph, mode, args, Path(tmp) / mode) for mode in ("dense", "sparse")]
    ratio = {"median_step_s": sparse["median_step_s"] / dense["median_step_s"],
             "uss_mb_rank0": sparse["uss_mb"][0] / dense["uss_mb"][0],
             "pss_mb_total": sum(sparse["pss_mb"]) / sum(dense["pss_mb"])}
    md = (f"# Sparse shared vs dense per-rank embedding: {args.words:,} featureless rows x {args.dim}, "
          f"{args.papers:,} papers, 2 ranks (fork, gloo), batch {args.batch_size}, {args.steps} steps\n\n"
          + harness.markdown_table(["embedding", "median step (s)", "USS rank 0 / 1 (MB)", "PSS rank 0 / 1 (MB)",
                                    "fit wall (s)"],
                                   [[r["mode"], f"{r['median_step_s']:.3f}", f"{r['uss_mb'][0]:.0f} / {r['uss_mb'][1]:.0f}",
                                     f"{r['pss_mb'][0]:.0f} / {r['pss_mb'][1]:.0f}", f"{r['fit_wall_s']:.1f}"]
                                    for r in results])
          + f"\n\nsparse / dense: step time {ratio['median_step_s']:.3f}x, rank-0 USS {ratio['uss_mb_rank0']:.3f}x, "
          f"total PSS {ratio['pss_mb_total']:.3f}x")
    payload = {"config": {k: str(v) for k, v in vars(args).items()}, "results": results,
               "ratios_sparse_over_dense": ratio}
    harness.write_outputs(args.out, "sparse_embedding", payload, md)
    print(md)
    return payload


if __name__ == "__main__":
    main()
