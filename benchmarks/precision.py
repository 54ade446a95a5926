"""bf16-mixed against 32-bit precision on CPU ranks: epoch time and test accuracy, side by side.

    bash scripts/env.sh python benchmarks/precision.py                # 1Mx10 synthetic + Tolokers
    bash scripts/env.sh python benchmarks/precision.py --tiny         # seconds (smoke test)

Each round trains the example's GraphSAGE with 2 ranks once per precision, alternating which
goes first; rank 0's epochs after a warm-up one; test metrics from a float32 evaluation.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import workload
from workload import cap_train

PRECISIONS = ("32", "bf16-mixed")


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("precision", __doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", choices=workload.DATASETS, default=list(workload.DATASETS))
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("1Mx10"))
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--max-train-nodes", type=int, default=60_000)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="runs per precision, interleaved (default %(default)s)")
    p.add_argument("--hidden", type=int, default=128)
    args = p.parse_args(argv)
    if args.tiny:
        args.datasets, args.size, args.epochs, args.rounds = ["synthetic"], workload.parse_size("20kx10"), 2, 1
        args.max_train_nodes = 4_000
    return args


def run(graph: Any, precision: str, args: Any, batch_size: int) -> Dict[str, Any]:
    task = workload.BenchTask(graph, fanouts=[10, 10], hidden=args.hidden, batch_size=batch_size, lr=3e-3,
                              dropout=0.5)
    res = workload.fit(graph, task, args.epochs, precision=precision)
    return dict(res, epoch_s=harness.median(workload.steady(res["epoch_times_s"])))


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    started, busy = time.perf_counter(), harness.machine_info()
    results: List[Dict[str, Any]] = []
    for dataset in args.datasets:
        spec = {"dataset": dataset, **args.size, "feat_dim": args.feat_dim}
        graph = workload.build_graph(spec)
        n_train = cap_train(graph, args.max_train_nodes)
        batch_size = 256 if dataset == "tolokers" else 512
        runs, _ = harness.interleave({p: (lambda rnd, p=p: run(graph, p, args, batch_size)) for p in PRECISIONS},
                                     args.rounds, dataset, lambda r: f"epoch {r['epoch_s']:.2f} s, "
                                                                     f"test_acc {r['test_acc']:.4f}", alternate=True)
        label = "tolokers" if dataset == "tolokers" else f"synthetic {workload.size_label(args.size)}"
        row: Dict[str, Any] = {"graph": label, "train_nodes": n_train}
        for precision in PRECISIONS:
            row[precision] = {k: harness.median([x[k] for x in runs[precision] if k in x])
                              for k in ("epoch_s", "test_acc", "test_auc") if k in runs[precision][0]}
            row[precision]["runs"] = runs[precision]
        row["time_ratio"] = row["bf16-mixed"]["epoch_s"] / row["32"]["epoch_s"]
        results.append(row)
    headers = ["graph", "train nodes", "precision", "epoch (s, median)", "bf16 / 32 time", "test acc", "test ROC-AUC"]
    rows = []
    for row in results:
        for precision in PRECISIONS:
            m = row[precision]
            rows.append([row["graph"], row["train_nodes"], precision, f"{m['epoch_s']:.2f}",
                         harness.fmt_ratio(row["time_ratio"]) if precision != "32" else "",
                         f"{m['test_acc']:.4f}", f"{m['test_auc']:.4f}" if "test_auc" in m else ""])
    markdown = harness.markdown_table(headers, rows)
    print(markdown, flush=True)

    payload = {"benchmark": "precision", "args": {k: str(v) for k, v in vars(args).items()}, "machine": busy,
               "versions": harness.versions(), "results": results, "wall_s": time.perf_counter() - started}
    harness.write_outputs(args.out, "precision", payload, markdown, harness.bar_plot(
        {f"{r['graph']}\n{p}": r[p]["epoch_s"] for r in results for p in PRECISIONS}, "epoch time (s, 2 CPU ranks)"),
        figsize=(7, 4))
    return payload


if __name__ == "__main__":
    main()
