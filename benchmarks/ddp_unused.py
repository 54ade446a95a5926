"""DDP's "did not find any unused parameters" warning with HeteroSAGE, 2 ranks (fork, gloo): per
configuration (a fresh interpreter: DDP warns on stderr) finished or not, the error's last line,
the ranks that warned, rank 0's median step time after 2 warm-up steps.

    python benchmarks/ddp_unused.py [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any, Dict

import harness  # first: graphtrainer from this checkout
import workload
from sparse_embedding import HeteroSeeds, step_times

WARNING = "did not find any unused parameters"
#: name -> (seed types, Trainer keyword arguments)
CONFIGS: Dict[str, Any] = {
    f"{seeds} seeds, {option}": (seeds.split("+"), kwargs) for seeds in ("paper+word", "paper")
    for option, kwargs in (("find_unused=False", {}), ("find_unused=True", {"find_unused_parameters": True}),
                           ("static_graph=True", {"ddp_kwargs": {"static_graph": True}}))}


def child(name: str, steps: int) -> None:
    """Fits configuration ``name``; prints rank 0's step times last."""
    import torch
    from graphtrainer.datasets import synthetic_hetero

    graph = synthetic_hetero(20000, 4000, avg_degree=5, words_per_paper=3, feat_dim=16, num_classes=4)
    graph.nodes["word"].data["label"] = torch.arange(4000) % 4
    types, kwargs = CONFIGS[name]
    run = workload.fit(graph, HeteroSeeds(graph, types, 256, embed_dim=16), 1, evaluate_test=False,
                       launcher="fork", limit_train_batches=steps, **kwargs)
    print(json.dumps(step_times(run)))


def run(name: str, steps: int) -> Dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(steps)], capture_output=True,
                          text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line and "Warning" not in line]
    times = json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else []
    return {"config": name, "finished": proc.returncode == 0, "error": errors[-1][:300] if errors else "",
            "ranks_warning": proc.stderr.count(WARNING), "wall_s": time.perf_counter() - start,
            "median_step_s": harness.median(times[2:]) if len(times) > 2 else None}


def main(argv: Any = None) -> Any:
    parser = harness.base_parser("ddp_unused", __doc__, tiny={"steps": 4})
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20, help="steps per configuration (default %(default)s)")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.steps)
    rows = [run(name, args.steps) for name in CONFIGS]
    md = harness.markdown_table(
        ["configuration", "finished", "ranks printing the warning", "median step (s)", "error"],
        [[r["config"], r["finished"], r["ranks_warning"], f"{r['median_step_s']:.4f}" if r["median_step_s"] else "-",
          r["error"]] for r in rows])
    return harness.report(args, {"steps": args.steps, "rows": rows}, md)


if __name__ == "__main__":
    main()
