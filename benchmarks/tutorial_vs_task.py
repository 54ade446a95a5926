"""DGL's multi-GPU tutorial script against the same job as a GraphTask with every graphtrainer
default: epoch time and peak memory at 1, 2 and 4 ranks, interleaved.

    python benchmarks/tutorial_vs_task.py --datasets tolokers --world-sizes 2   # the issue's figure
    python benchmarks/tutorial_vs_task.py --tiny                                 # seconds (smoke test)

Arms: ``dgl_tutorial.py`` as its readers run it (each spawned process loads the graph), and
``tutorial_task.py`` (``Trainer(num_procs=N)``, every default); each run a fresh process on the
same graph file. Epoch time: rank 0's, mean over epochs 2..E. Peak PSS of the process tree.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload

NAME = "tutorial_vs_task"
HERE = Path(__file__).resolve().parent
#: Epoch time B / A at most (by rank count), peak total PSS B / A at most.
EPOCH_TARGETS = {1: 0.90, 2: 0.95, 4: 0.95}
PSS_TARGET = 0.85
ARMS = {"tutorial": "dgl_tutorial.py", "graphtrainer": "tutorial_task.py"}


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", choices=workload.DATASETS, default=list(workload.DATASETS))
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("1Mx10"),
                   help="synthetic graph NODESxDEGREE (default 1Mx10: 1M nodes, 10M edges)")
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--max-train-nodes", type=int, default=60_000,
                   help="cap the training nodes, same seeded subset for both arms (default %(default)s: "
                        "59 batches per epoch; Tolokers has 5,879)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--epochs", type=int, default=6, help="per run; epoch 1 is warm-up (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved passes (default %(default)s)")
    args = p.parse_args(argv)
    if args.tiny:
        args.size = workload.parse_size("20kx5")
        if "--datasets" not in (argv if argv is not None else sys.argv):
            args.datasets = ["synthetic"]
        args.feat_dim, args.max_train_nodes, args.epochs, args.rounds = 16, 4096, 2, 1
        if "--world-sizes" not in (argv if argv is not None else sys.argv):
            args.world_sizes = [1, 2]
    if args.epochs < 2 or args.rounds < 1 or min(args.world_sizes) < 1:
        p.error("--epochs must be >= 2 (the first is warm-up), --rounds and --world-sizes >= 1")
    return args


def prepare_graph(spec: Dict[str, Any], cap: int, path: str) -> int:
    """Build the graph, keep a seeded ``cap`` of its training nodes, save it to ``path``."""
    import dgl

    graph = workload.build_graph(spec)
    n_train = workload.cap_train(graph, cap)
    for split in ("val", "test"):
        graph.ndata[f"{split}_mask"] = graph.ndata[f"{split}_mask"].bool()
    dgl.save_graphs(path, [graph])
    return n_train


def run_arm(arm: str, graph_file: str, world: int, epochs: int, tmp: str) -> Dict[str, Any]:
    """One run in a fresh process: epoch starts from its JSON, peak total PSS of its tree."""
    out = os.path.join(tmp, f"{arm}-{world}.json")
    run = harness.run_process([sys.executable, str(HERE / ARMS[arm]), graph_file, str(world), str(epochs), out],
                              f"{arm} with {world} rank(s)", peak_pss=True)
    data = json.loads(Path(out).read_text())
    os.remove(out)
    ends = data["epoch_starts"][1:] + [data["end"]]
    epoch_s = [b - a for a, b in zip(data["epoch_starts"], ends)]
    return {"epoch_s": epoch_s, "mean_epoch_s": statistics.fmean(epoch_s[1:]), "steps_per_epoch": data["steps_per_epoch"],
            "peak_total_pss_mb": run["peak_total_pss_mb"], "run_wall_s": run["wall_s"], "other_cores": run["other_cores"]}


def analyse(label: str, n_train: int, runs: Dict[str, Dict[int, List[Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    rows = []
    for world in sorted(runs["tutorial"]):
        a, b = runs["tutorial"][world], runs["graphtrainer"][world]
        mean = {k: statistics.fmean(r["mean_epoch_s"] for r in v[world]) for k, v in runs.items()}
        pss = {k: statistics.fmean(r["peak_total_pss_mb"] for r in v[world]) for k, v in runs.items()}
        row = {"graph": label, "train_nodes": n_train, "world": world, "mean_epoch_s": mean, "peak_total_pss_mb": pss,
               "epoch_ratio": mean["graphtrainer"] / mean["tutorial"],
               "pair_ratios": [y["mean_epoch_s"] / x["mean_epoch_s"] for x, y in zip(a, b)],
               "pss_ratio": pss["graphtrainer"] / pss["tutorial"],
               "steps_per_epoch_rank0": b[0]["steps_per_epoch"],
               "other_cores": statistics.fmean(r["other_cores"] for v in runs.values() for r in v[world])}
        target = EPOCH_TARGETS.get(world, 0.95)
        row["epoch_target"], row["met_epoch"] = target, row["epoch_ratio"] <= target
        row["met_pss"] = row["pss_ratio"] <= PSS_TARGET
        rows.append(row)
    return rows


def render(rows: List[Dict[str, Any]], args: Any) -> str:
    headers = ["graph", "ranks", "steps/epoch (rank 0)", "tutorial s/epoch", "graphtrainer s/epoch", "epoch ratio",
               "per-round ratios", "target", "tutorial peak PSS MB", "graphtrainer peak PSS MB", "PSS ratio",
               f"PSS <= {PSS_TARGET}x", "other load (cores)"]
    table = []
    for r in rows:
        met = "yes" if r["met_epoch"] else "**no**"
        table.append([r["graph"], r["world"], r["steps_per_epoch_rank0"], round(r["mean_epoch_s"]["tutorial"], 3),
                      round(r["mean_epoch_s"]["graphtrainer"], 3), f"{r['epoch_ratio']:.2f}x",
                      " / ".join(f"{x:.2f}" for x in r["pair_ratios"]),
                      f"<= {r['epoch_target']:.2f}x: {met}{harness.noise_note(r['other_cores'])}",
                      r["peak_total_pss_mb"]["tutorial"], r["peak_total_pss_mb"]["graphtrainer"],
                      f"{r['pss_ratio']:.2f}x", "yes" if r["met_pss"] else "**no**", f"{r['other_cores']:.2f}"])
    md = harness.markdown_table(headers, table)
    md += (f"\n\nMean epoch time over epochs 2-{args.epochs} of each run, then the mean over {args.rounds} "
           f"interleaved run(s) per arm; ratio = graphtrainer / tutorial. Peak PSS: the whole process tree's.")
    return md


def draw_for(rows: List[Dict[str, Any]]) -> Any:
    return harness.bar_plot({f"{r['graph']} x{r['world']}\n{k}": r[f"{k}_ratio"] for r in rows for k in ("epoch", "pss")},
                            "graphtrainer / tutorial")


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    specs = workload.graph_specs(args.datasets, [args.size], args.feat_dim)
    machine, t_start = harness.machine_info(), time.time()
    arms = list(ARMS)
    rows: List[Dict[str, Any]] = []
    raw: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tutorial-vs-task-") as tmp:
        for spec in specs:
            path = os.path.join(tmp, f"{spec['label']}.bin")
            n_train = prepare_graph(spec, args.max_train_nodes, path)
            runs: Dict[str, Dict[int, List[Dict[str, Any]]]] = {k: {w: [] for w in args.world_sizes} for k in arms}
            for rnd in range(args.rounds):
                for world in args.world_sizes:
                    for arm in arms:
                        res = run_arm(arm, path, world, args.epochs, tmp)
                        res["loadavg_1min"] = round(os.getloadavg()[0], 2)
                        runs[arm][world].append(res)
                        print(f"[{NAME}] {spec['label']} round {rnd + 1} x{world} {arm}: epochs "
                              f"{[round(t, 3) for t in res['epoch_s']]} peak PSS {res['peak_total_pss_mb']:.0f} MB "
                              f"(other load {res['other_cores']} cores)", flush=True)
            rows += analyse(spec["label"], n_train, runs)
            raw[spec["label"]] = runs
            os.remove(path)
    md = render(rows, args)
    payload = {"benchmark": NAME, "machine": machine, "versions": harness.versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "wall_s": round(time.time() - t_start, 1), "results": rows, "runs": raw}
    harness.write_outputs(args.out, NAME, payload, md, draw_for(rows), figsize=(10, 4))
    print(md)
    return payload


if __name__ == "__main__":
    main()
