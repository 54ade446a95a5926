"""PyG's GraphSAGE on PyG batches (B; B-T: with PyG's per-layer trimming, ``--trim-arm``) against
graphtrainer's SAGE on DGL's blocks (A): the same task, DGL sampling, 2 CPU ranks, interleaved
A B A B; median epoch time, B / A and test accuracy with every neighbour. The GPU pair:
``tests/helpers/pyg_gpu_script.py --bench``.

    bash scripts/env.sh python benchmarks/pyg_vs_blocks.py [--trim-arm]   # full run
    bash scripts/env.sh python benchmarks/pyg_vs_blocks.py --tiny         # seconds (smoke test)
"""
from __future__ import annotations

from typing import Any, Dict

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload

TARGET = 1.10
LABELS = {"blocks": "A: graphtrainer SAGE on DGL blocks", "pyg": "B: PyG GraphSAGE on PyG batches",
          "pyg_trim": "B-T: PyG GraphSAGE, trimmed per layer"}


class PygBenchTask(workload.BenchTask):
    """BenchTask with PyG's GraphSAGE on PyG batches (``trim``: PyG's per-layer trimming)."""

    batch_format, trim = "pyg", False

    def configure_model(self) -> Any:
        from torch_geometric.nn import GraphSAGE

        return GraphSAGE(self.in_feats, self.hidden, num_layers=len(self.fanouts), out_channels=self.num_classes,
                         dropout=self.dropout)

    def _forward(self, batch: Any) -> tuple:
        trim = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                "num_sampled_edges_per_hop": batch.num_sampled_edges} if self.trim else {}
        return self.model(batch.x, batch.edge_index, **trim)[:batch.batch_size], batch.y[:batch.batch_size]


def pyg_test_accuracy(task: Any, graph: Any) -> float:
    """Rank 0's PyG weights on the test nodes with every neighbour (``workload.evaluate`` for blocks)."""
    import dgl
    import torch

    from graphtrainer.nn.pyg import to_pyg

    ids, model, correct = workload.split_ids(graph, "test"), task.module.eval(), 0
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(task.fanouts), prefetch_node_feats=["feat"],
                                                            prefetch_labels=["label"])
    with torch.no_grad():
        for batch in map(to_pyg, dgl.dataloading.DataLoader(graph, ids, sampler, batch_size=4096, shuffle=False)):
            correct += int((model(batch.x, batch.edge_index)[:batch.batch_size].argmax(1) == batch.y).sum())
    return correct / ids.numel()


def run_arm(graph: Any, args: Any, arm: str) -> Dict[str, Any]:
    kwargs = workload.task_kwargs(args)
    task = workload.BenchTask(graph, **kwargs) if arm == "blocks" else PygBenchTask(graph, **kwargs)
    task.trim = arm == "pyg_trim"
    res = workload.fit(graph, task, args.epochs, evaluate_test=arm == "blocks")
    return res if arm == "blocks" else dict(res, test_acc=pyg_test_accuracy(task, graph))


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("pyg_vs_blocks", __doc__, rounds=2, tiny=workload.TINY)
    parser.add_argument("--trim-arm", action="store_true", help="add PyG's GraphSAGE with per-layer trimming (B-T)")
    args = workload.training_options(parser, size="200kx10", max_train_nodes=10_000, epochs=3).parse_args(argv)
    ((spec, graph, n_train),) = workload.prepared_graphs(args)
    arms = ["blocks", "pyg"] + (["pyg_trim"] if args.trim_arm else [])
    runs, order = harness.interleave({a: (lambda rnd, a=a: run_arm(graph, args, a)) for a in arms}, args.rounds,
                                     "pyg_vs_blocks")
    summary = workload.summarise(runs, "blocks", metric="test_acc")
    md = (f"# PyG batches vs DGL blocks ({spec['label']}, {n_train:,} training seeds, fanouts {args.fanouts}, "
          f"hidden {args.hidden}, batch {args.batch_size}, 2 CPU ranks, {args.rounds} rounds)\n\n"
          + workload.arms_table(summary, LABELS, "A") + f"\n\nTarget for B: at most {TARGET:.2f}x A's epoch time.\n")
    import torch_geometric

    payload = {"runs": runs, "order": order, **summary, "target": TARGET,
               "versions": {**harness.versions(), "torch_geometric": torch_geometric.__version__}}
    return harness.report(args, payload, md, harness.bar_plot(
        {LABELS[a]: summary["median_epoch_s"][a] for a in arms}, "median epoch time (s)"), figsize=(8, 4))


if __name__ == "__main__":
    main()
