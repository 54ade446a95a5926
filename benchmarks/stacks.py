"""The newest tested set against the pinned one: the same task, graph and seeds under each set's
interpreter in turn, median epoch time newest / pinned per ``--dropouts`` value, and the ops behind dropout.

    python benchmarks/stacks.py            # Tolokers, 2 ranks, 3 rounds, dropout 0.5 and 0
    python benchmarks/stacks.py --tiny     # seconds (smoke test)
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any, Dict

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload  # before dgl: graphtrainer's compatibility layer lets dgl load on the newest set

VENVS = {"pinned": harness.ROOT / ".venv", "newest": harness.ROOT / ".venv-newest"}


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("stacks", __doc__, rounds=3,
                            tiny={"dataset": "synthetic", "num_nodes": 3_000, "epochs": 2, "rounds": 1})
    p.add_argument("--dataset", choices=["tolokers", "synthetic"], default="tolokers")
    p.add_argument("--num-nodes", type=int, default=200_000, help="synthetic graph (default %(default)s)")
    p.add_argument("--epochs", type=int, default=6, help="per run; the first is warm-up")
    p.add_argument("--num-procs", type=int, default=2)
    p.add_argument("--dropouts", type=float, nargs="+", default=[0.5, 0.0],
                   help="the task's dropout, one arm each (default: 0.5 0)")
    for stack, venv in VENVS.items():
        p.add_argument(f"--{stack}-python", type=Path, default=venv / "bin" / "python",
                       help=f"the {stack} set's interpreter (default %(default)s)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one run, its result to this file
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    for stack in VENVS:
        if not getattr(args, f"{stack}_python").exists():
            raise SystemExit(f"error: {getattr(args, f'{stack}_python')} is missing: make it with "
                             f"GRAPHTRAINER_STACK={stack} bash scripts/env.sh true")
    arms = {f"{s} {d}": (lambda rnd, s=s, d=d: run_once(s, args, d)) for d in args.dropouts for s in VENVS}
    runs, order = harness.interleave(arms, args.rounds, "stacks", alternate=True)
    by_stack = {s: [r for d in args.dropouts for r in runs[f"{s} {d}"]] for s in VENVS}
    sums = {str(d): workload.summarise({s: runs[f"{s} {d}"] for s in VENVS}, "pinned") for d in args.dropouts}
    by_dropout = {d: {"median_epoch_s": a["median_epoch_s"], "pair_ratios": a["pair_ratios"]["newest"],
                      "ratio_newest_over_pinned": a["ratios"]["newest"]} for d, a in sums.items()}
    ops = {s: {k: harness.median([r["ops_ms"][k] for r in rs]) for k in rs[0]["ops_ms"]} for s, rs in by_stack.items()}
    versions = {s: {"torch": rs[0]["torch"], "dgl": rs[0]["dgl"]} for s, rs in by_stack.items()}
    # The headline is the first dropout's (the example's own task by default).
    summary = {**by_dropout[str(args.dropouts[0])], "dropout": args.dropouts[0], "by_dropout": by_dropout,
               "ops_ms": ops, "versions": versions}
    rows = [[d, *(f"{r['median_epoch_s'][s]:.3f}" for s in VENVS), f"**{r['ratio_newest_over_pinned']:.3f}x**",
             " / ".join(f"{x:.3f}" for x in r["pair_ratios"])] for d, r in by_dropout.items()]
    md = "\n\n".join([
        f"# Newest vs pinned stack ({args.dataset}, {args.num_procs} ranks, {args.rounds} rounds of "
        f"{args.epochs} epochs, the first left out)",
        "; ".join(f"{s}: torch {x['torch']}, dgl {x['dgl']}" for s, x in versions.items()),
        harness.markdown_table(["task dropout", "pinned median epoch (s)", "newest median epoch (s)",
                                "newest / pinned epoch time", "each round"], rows),
        "One thread, a 3,000 x 128 float tensor, ms per call (median over runs):",
        harness.markdown_table(["stack", *ops["pinned"]], [[s, *(f"{ms:.2f}" for ms in ops[s].values())]
                                                          for s in VENVS])])
    return harness.report(args, {"summary": summary, "order": order, "runs": by_stack}, md)


def worker(args: argparse.Namespace) -> None:
    """One training run in this interpreter: epoch times, versions and the dropout ops' timings."""
    import dgl
    import torch

    spec = ({"dataset": "tolokers"} if args.dataset == "tolokers" else
            {"dataset": "synthetic", "num_nodes": args.num_nodes, "avg_degree": 10, "feat_dim": 64})
    graph = workload.build_graph(spec)
    task = workload.BenchTask(graph, fanouts=[10, 10], hidden=128, batch_size=256, lr=3e-3, dropout=args.dropouts[0])
    res = workload.fit(graph, task, args.epochs, evaluate_test=False, num_procs=args.num_procs,
                       enable_model_summary=None)
    args.worker.write_text(json.dumps({"epoch_times_s": res["epoch_times_s"], "torch": torch.__version__,
                                       "dgl": dgl.__version__, "dropout": args.dropouts[0], "ops_ms": time_ops()}))


def time_ops(calls: int = 50) -> Dict[str, float]:
    """Ms per call, one thread, of the ops behind dropout on about a Tolokers batch's hidden layer."""
    import torch
    import torch.nn.functional as F
    from torch.utils.benchmark import Timer

    from graphtrainer.nn.dropout import dropout

    x = torch.randn(3000, 128)
    ops = {"F.dropout": lambda: F.dropout(x, 0.5, True), "bernoulli_": lambda: torch.empty_like(x).bernoulli_(0.5),
           "rand_like": lambda: torch.rand_like(x), "graphtrainer.nn.Dropout": lambda: dropout(x, 0.5)}
    return {k: Timer("op()", globals={"op": op}, num_threads=1).timeit(calls).mean * 1e3 for k, op in ops.items()}


def run_once(stack: str, args: argparse.Namespace, dropout: float) -> Dict[str, Any]:
    options = {"dataset": args.dataset, "num-nodes": args.num_nodes, "epochs": args.epochs,
               "num-procs": args.num_procs, "dropouts": dropout}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        harness.run_process([str(getattr(args, f"{stack}_python")), __file__, "--worker", str(out),
                             *(x for k, v in options.items() for x in (f"--{k}", str(v)))], f"the {stack} run", 1800)
        return json.loads(out.read_text())


if __name__ == "__main__":
    main()
