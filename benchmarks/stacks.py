"""The newest tested set against the pinned one: the same GraphTask, graph and seeds trained
under each set's venv in turn (pinned, newest, newest, pinned, ...), epoch time side by side.

    python benchmarks/stacks.py                       # Tolokers, 2 ranks, 3 rounds, dropout 0.5 and 0
    python benchmarks/stacks.py --tiny                # seconds (smoke test)

Each run: a fresh interpreter of ``.venv`` or ``.venv-newest`` on ``workload.BenchTask``, one arm
per ``--dropouts`` value; ratio = median newest epoch / median pinned. Each worker also times
the operations behind dropout on one thread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = {"pinned": ROOT / ".venv", "newest": ROOT / ".venv-newest"}


def parse_args(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=["tolokers", "synthetic"], default="tolokers")
    p.add_argument("--num-nodes", type=int, default=200_000, help="synthetic graph (default %(default)s)")
    p.add_argument("--epochs", type=int, default=6, help="per run; the first is warm-up")
    p.add_argument("--rounds", type=int, help="pinned/newest pairs, interleaved (default 3; --tiny: 1)")
    p.add_argument("--num-procs", type=int, default=2)
    p.add_argument("--dropouts", type=float, nargs="+", default=[0.5, 0.0],
                   help="the task's dropout, one arm each (default: 0.5 0)")
    p.add_argument("--tiny", action="store_true", help="a small synthetic graph, 2 epochs, 1 round")
    p.add_argument("--out", type=Path, default=HERE / "results" / "stacks")
    for stack, venv in VENVS.items():
        p.add_argument(f"--{stack}-python", type=Path, default=venv / "bin" / "python",
                       help=f"the {stack} set's interpreter (default %(default)s)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one run, result to this file
    args = p.parse_args(argv)
    if args.tiny:
        args.dataset, args.num_nodes, args.epochs = "synthetic", 3_000, 2
    if args.rounds is None:
        args.rounds = 1 if args.tiny else 3
    return args


def worker(args: argparse.Namespace) -> None:
    """One training run in this interpreter; writes epoch times and versions to ``args.worker``."""
    sys.path.insert(0, str(HERE))
    import harness  # noqa: F401  (first: graphtrainer from this checkout)
    import torch
    import workload  # before dgl: graphtrainer's compatibility layer lets dgl load on the newest set

    import dgl

    spec = ({"dataset": "tolokers"} if args.dataset == "tolokers" else
            {"dataset": "synthetic", "num_nodes": args.num_nodes, "avg_degree": 10, "feat_dim": 64})
    graph = workload.build_graph(spec)
    task = workload.BenchTask(graph, fanouts=[10, 10], hidden=128, batch_size=256, lr=3e-3,
                              dropout=args.dropouts[0])
    res = workload.fit(graph, task, args.epochs, evaluate_test=False, num_procs=args.num_procs,
                       enable_model_summary=None)
    args.worker.write_text(json.dumps({"epoch_times_s": res["epoch_times_s"], "torch": torch.__version__,
                                       "dgl": dgl.__version__, "dropout": args.dropouts[0],
                                       "ops_ms": time_random_ops()}))


def time_random_ops(shape: Any = (3000, 128), calls: int = 50) -> Dict[str, float]:
    """Milliseconds per call, on one thread, of the operations behind a dropout layer (the
    hidden layer of a Tolokers batch is about this size)."""
    import torch
    import torch.nn.functional as F

    from graphtrainer.nn.dropout import dropout

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x = torch.randn(*shape)
    ops = {"F.dropout": lambda: F.dropout(x, 0.5, True), "bernoulli_": lambda: torch.empty_like(x).bernoulli_(0.5),
           "rand_like": lambda: torch.rand_like(x), "graphtrainer.nn.Dropout": lambda: dropout(x, 0.5)}
    out = {}
    for name, op in ops.items():
        for _ in range(5):
            op()
        t = time.perf_counter()
        for _ in range(calls):
            op()
        out[name] = (time.perf_counter() - t) / calls * 1e3
    torch.set_num_threads(threads)
    return out


def run_once(stack: str, args: argparse.Namespace, dropout: float) -> Dict[str, Any]:
    python = getattr(args, f"{stack}_python")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [str(python), str(Path(__file__).resolve()), "--worker", str(out), "--dataset", args.dataset,
               "--num-nodes", str(args.num_nodes), "--epochs", str(args.epochs),
               "--num-procs", str(args.num_procs), "--dropouts", str(dropout)]
        env = dict(os.environ, DGLBACKEND="pytorch")
        subprocess.run(cmd, check=True, env=env, timeout=1800)
        return json.loads(out.read_text())


def summarise(runs: Dict[str, List[Dict[str, Any]]], dropouts: List[float]) -> Dict[str, Any]:
    """Per dropout: median epoch per stack and newest / pinned; the top-level figures are the
    first dropout's (the example's own task by default)."""
    by_dropout = {}
    for dropout in dropouts:
        epochs = {s: [t for r in rs if r["dropout"] == dropout for t in r["epoch_times_s"][1:]]
                  for s, rs in runs.items()}
        median = {s: statistics.median(t) for s, t in epochs.items()}
        by_dropout[str(dropout)] = {"median_epoch_s": median,
                                    "ratio_newest_over_pinned": median["newest"] / median["pinned"]}
    ops = {s: {k: statistics.median(r["ops_ms"][k] for r in rs) for k in rs[0]["ops_ms"]} for s, rs in runs.items()}
    return {**by_dropout[str(dropouts[0])], "dropout": dropouts[0], "by_dropout": by_dropout, "ops_ms": ops,
            "versions": {s: {"torch": rs[0]["torch"], "dgl": rs[0]["dgl"]} for s, rs in runs.items()}}


def render(summary: Dict[str, Any], args: argparse.Namespace, load: List[float]) -> str:
    v, ops = summary["versions"], summary["ops_ms"]
    rows = [f"| {d} | {r['median_epoch_s']['pinned']:.3f} | {r['median_epoch_s']['newest']:.3f} | "
            f"**{r['ratio_newest_over_pinned']:.3f}x** |" for d, r in summary["by_dropout"].items()]
    names = list(ops["pinned"])
    return "\n".join([
        f"# Newest vs pinned stack ({args.dataset}, {args.num_procs} ranks, {args.rounds} rounds, "
        f"{args.epochs} epochs each, first left out)", "",
        f"pinned: torch {v['pinned']['torch']}, dgl {v['pinned']['dgl']}; "
        f"newest: torch {v['newest']['torch']}, dgl {v['newest']['dgl']}", "",
        "| task dropout | pinned median epoch (s) | newest median epoch (s) | newest / pinned |",
        "|---|---:|---:|---:|", *rows, "",
        f"newest / pinned epoch time: **{summary['ratio_newest_over_pinned']:.3f}x** "
        f"(dropout {summary['dropout']})", "",
        "One thread, a 3,000 x 128 float tensor, ms per call (median over runs):", "",
        "| stack | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
        *(f"| {s} | " + " | ".join(f"{ops[s][k]:.2f}" for k in names) + " |" for s in ("pinned", "newest")), "",
        f"load average before/after: {load[0]:.2f} / {load[1]:.2f}",
        f"command: python benchmarks/stacks.py --dataset {args.dataset} --rounds {args.rounds} "
        f"--epochs {args.epochs} --dropouts {' '.join(str(d) for d in args.dropouts)}"
        + (f" --num-nodes {args.num_nodes}" if args.dataset == "synthetic" else ""), ""])


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    for stack in VENVS:
        if not getattr(args, f"{stack}_python").exists():
            raise SystemExit(f"error: {getattr(args, f'{stack}_python')} is missing: make it with "
                             f"GRAPHTRAINER_STACK={stack} bash scripts/env.sh true")
    load = [os.getloadavg()[0]]
    runs: Dict[str, List[Dict[str, Any]]] = {"pinned": [], "newest": []}
    for r in range(args.rounds):
        for dropout in args.dropouts:
            for stack in (("pinned", "newest") if r % 2 == 0 else ("newest", "pinned")):
                runs[stack].append(run_once(stack, args, dropout))
    load.append(os.getloadavg()[0])
    summary = summarise(runs, args.dropouts)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stacks.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    (args.out / "stacks.md").write_text(render(summary, args, load))
    print(render(summary, args, load))
    return summary


if __name__ == "__main__":
    main()
