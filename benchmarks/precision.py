"""bf16-mixed against 32-bit precision on CPU ranks: epoch time and test metrics, side by side.

    bash scripts/env.sh python benchmarks/precision.py                # 1Mx10 synthetic + Tolokers
    bash scripts/env.sh python benchmarks/precision.py --tiny         # seconds (smoke test)

Each round trains the example's GraphSAGE on 2 ranks once per precision (A B, then B A);
rank 0's epochs after a warm-up one; test metrics from a float32 evaluation.
"""
from __future__ import annotations

from typing import Any, Dict, List

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload

PRECISIONS = ("32", "bf16-mixed")


def run(graph: Any, spec: Dict[str, Any], args: Any, precision: str) -> Dict[str, Any]:
    task = workload.BenchTask(graph, **workload.task_kwargs(args, spec["batch_size"]))
    return workload.fit(graph, task, args.epochs, precision=precision)


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("precision", __doc__, rounds=2, tiny=workload.TINY)
    args = workload.training_options(parser, datasets=workload.DATASETS).parse_args(argv)
    results: List[Dict[str, Any]] = []
    for spec, graph, n_train in workload.prepared_graphs(args):
        arms = {p: (lambda rnd, p=p, g=graph, s=spec: run(g, s, args, p)) for p in PRECISIONS}
        runs, _ = harness.interleave(arms, args.rounds, spec["label"], alternate=True)
        summary = workload.summarise(runs, "32")
        label = spec["label"] if spec["dataset"] == "tolokers" else f"synthetic {spec['label']}"
        row: Dict[str, Any] = {"graph": label, "train_nodes": n_train, "time_ratio": summary["ratios"]["bf16-mixed"],
                               "pair_ratios": summary["pair_ratios"]["bf16-mixed"]}
        for precision in PRECISIONS:  # test_acc always; test_auc on binary labels (Tolokers)
            row[precision] = {"epoch_s": summary["median_epoch_s"][precision], "runs": runs[precision],
                              **{k: harness.median([r[k] for r in runs[precision]])
                                 for k in ("test_acc", "test_auc") if k in runs[precision][0]}}
        results.append(row)
    markdown = harness.markdown_table(
        ["graph", "train nodes", "precision", "median epoch (s)", "vs 32", "each round", "test acc", "test ROC-AUC"],
        [[r["graph"], r["train_nodes"], p, f"{r[p]['epoch_s']:.3f}", f"{r[p]['epoch_s'] / r['32']['epoch_s']:.3f}x",
          " / ".join(f"{x:.3f}" for x in r["pair_ratios"]) if p != "32" else "", f"{r[p]['test_acc']:.4f}",
          f"{r[p]['test_auc']:.4f}" if "test_auc" in r[p] else ""] for r in results for p in PRECISIONS])
    return harness.report(args, {"results": results}, markdown, harness.bar_plot(
        {f"{r['graph']}\n{p}": r[p]["epoch_s"] for r in results for p in PRECISIONS}, "epoch time (s, 2 CPU ranks)"),
        figsize=(7, 4))


if __name__ == "__main__":
    main()
