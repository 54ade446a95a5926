"""PyG's GraphSAGE on PyG batches against graphtrainer's SAGE on DGL's blocks: the same task,
2 CPU ranks, interleaved A B A B, median epoch time and the ratio B / A.

    bash scripts/env.sh python benchmarks/pyg_vs_blocks.py [--trim-arm]   # full run
    bash scripts/env.sh python benchmarks/pyg_vs_blocks.py --tiny         # seconds (smoke test)

A: ``workload.BenchTask`` (SAGE on blocks). B: ``batch_format="pyg"`` and
``torch_geometric.nn.GraphSAGE`` as PyG's tutorial calls it; B-T: with PyG's per-layer
trimming. DGL samples in every arm. Test accuracy with every neighbour shows both learned.
The GPU pair: ``tests/helpers/pyg_gpu_script.py --bench``.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload
from workload import cap_train

NAME = "pyg_vs_blocks"
TARGET = 1.10


class PygBenchTask(workload.BenchTask):
    """BenchTask with PyG's GraphSAGE on PyG batches (``trim``: PyG's per-layer trimming)."""

    batch_format = "pyg"

    def __init__(self, graph: Any, trim: bool = False, **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.trim = trim

    def configure_model(self) -> Any:
        from torch_geometric.nn import GraphSAGE

        return GraphSAGE(self.in_feats, self.hidden, num_layers=len(self.fanouts), out_channels=self.num_classes,
                         dropout=self.dropout)

    def _forward(self, batch: Any) -> tuple:
        trim = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                "num_sampled_edges_per_hop": batch.num_sampled_edges} if self.trim else {}
        return self.model(batch.x, batch.edge_index, **trim)[:batch.batch_size], batch.y[:batch.batch_size]


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("200kx10"),
                   help="synthetic graph NODESxDEGREE (default 200kx10)")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--max-train-nodes", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=3, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="A B pairs, interleaved (default %(default)s)")
    p.add_argument("--trim-arm", action="store_true", help="add PyG's GraphSAGE with per-layer trimming (B-T)")
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=512)
    args = p.parse_args(argv)
    if args.tiny:
        args.size, args.feat_dim, args.hidden = workload.parse_size("20kx5"), 16, 32
        args.max_train_nodes, args.batch_size, args.epochs, args.rounds = 2048, 256, 2, 1
    return args


def run_arm(graph: Any, args: Any, arm: str) -> Dict[str, Any]:
    common = dict(fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                  batch_size=args.batch_size, lr=3e-3, dropout=0.5)
    task = workload.BenchTask(graph, **common) if arm == "blocks" else PygBenchTask(graph, trim=arm == "pyg_trim",
                                                                                     **common)
    res = workload.fit(graph, task, args.epochs, evaluate_test=False)
    return dict(res, test_acc=test_accuracy(task, graph, arm))


def test_accuracy(task: Any, graph: Any, arm: str) -> float:
    """Rank 0's weights on the test nodes with every neighbour."""
    import torch

    ids = workload.split_ids(graph, "test")
    if arm == "blocks":
        return float(workload.evaluate(task.module, graph, ids)["test_acc"])
    import dgl

    from graphtrainer.nn.pyg import to_pyg

    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(task.fanouts), prefetch_node_feats=["feat"],
                                                            prefetch_labels=["label"])
    model, correct = task.module.eval(), 0
    with torch.no_grad():
        for batch in dgl.dataloading.DataLoader(graph, ids, sampler, batch_size=4096, shuffle=False):
            data = to_pyg(batch)
            out = model(data.x, data.edge_index)[:data.batch_size]
            correct += int((out.argmax(1) == data.y).sum())
    return correct / ids.numel()


def summarise(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    kept = {arm: [t for r in rs for t in r["epoch_times_s"][1:]] for arm, rs in runs.items()}
    median = {arm: statistics.median(ts) for arm, ts in kept.items()}
    return {"median_epoch_s": median, "ratios": {arm: median[arm] / median["blocks"] for arm in median},
            "test_acc": {arm: statistics.mean(r["test_acc"] for r in rs) for arm, rs in runs.items()}}


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    machine = harness.machine_info()
    spec = {"dataset": "synthetic", **args.size, "feat_dim": args.feat_dim, "num_classes": 8, "seed": 0}
    graph = workload.build_graph(spec)
    n_train = cap_train(graph, args.max_train_nodes)
    arms = ["blocks", "pyg"] + (["pyg_trim"] if args.trim_arm else [])
    runs, _ = harness.interleave({arm: (lambda rnd, arm=arm: run_arm(graph, args, arm)) for arm in arms}, args.rounds,
                                 NAME, lambda r: f"epochs {[round(t, 2) for t in r['epoch_times_s']]} s, "
                                                 f"test_acc {r['test_acc']:.4f}")
    result = summarise(runs)
    labels = {"blocks": "A: graphtrainer SAGE on DGL blocks", "pyg": "B: PyG GraphSAGE on PyG batches",
              "pyg_trim": "B-T: PyG GraphSAGE, trimmed per layer"}
    rows = [[labels[a], result["median_epoch_s"][a], f"{result['ratios'][a]:.2f}x", f"{result['test_acc'][a]:.4f}"]
            for a in arms]
    md = (f"# PyG batches vs DGL blocks ({workload.size_label(args.size)}, {n_train:,} training seeds, fanouts "
          f"{args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, 2 CPU ranks, {args.rounds} rounds)\n\n"
          + harness.markdown_table(["arm", "median epoch (s)", "time vs A", "test acc"], rows)
          + f"\n\nTarget for B: at most {TARGET:.2f}x A's epoch time.\n")
    import torch_geometric

    versions = {**harness.versions(), "torch_geometric": torch_geometric.__version__}
    payload = {"benchmark": NAME, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "machine": machine, "versions": versions, "runs": runs, **result, "target": TARGET}

    paths = harness.write_outputs(args.out, NAME, payload, md, harness.bar_plot(
        {labels[a]: result["median_epoch_s"][a] for a in arms}, "median epoch time (s)"), figsize=(8, 4))
    print(md, flush=True)
    print(f"written: {', '.join(str(p) for p in paths.values())}", flush=True)
    return payload


if __name__ == "__main__":
    main()
