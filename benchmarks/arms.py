"""Training arms compared on the same fit of 2 CPU ranks, one comparison per sub-command (``NAME --help``).

    bash scripts/env.sh python benchmarks/arms.py precision                # bf16-mixed against 32-bit
    bash scripts/env.sh python benchmarks/arms.py pyg_vs_blocks [--trim-arm]
    bash scripts/env.sh python benchmarks/arms.py workers [--hetero]       # 0, 1, 2 sampling workers
    bash scripts/env.sh python benchmarks/arms.py nn                       # graphtrainer.nn against dgl.nn
    python benchmarks/arms.py stacks [--dropouts 0.5 0]   # the newest tested set's interpreter against the pinned
"""
from __future__ import annotations

from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import torch
import workload
from graphtrainer import datasets
from graphtrainer.examples.hetero_classification import HeteroClassification
from graphtrainer.examples.node_classification import NodeClassification
from graphtrainer.nn.pyg import to_pyg


def _fit(graph: Any, args: Any, batch_size: Any, rnd: int, **fit_kwargs: Any) -> Dict[str, Any]:
    task = workload.BenchTask(graph, **workload.task_kwargs(args, batch_size))
    return workload.fit(graph, task, args.epochs, **fit_kwargs)


PRECISIONS = ("32", "bf16-mixed")


def precision(argv: List[str]) -> Dict[str, Any]:
    """bf16-mixed against 32-bit precision: median epoch and test metrics (1Mx10 synthetic and Tolokers).
    Each round trains once per precision (A B, then B A); test metrics from a float32 evaluation."""
    parser = harness.base_parser("precision", str(precision.__doc__), rounds=2, tiny=workload.TINY)
    args = workload.training_options(parser, datasets=workload.DATASETS).parse_args(argv)
    results: List[Dict[str, Any]] = []
    for spec, graph, n_train in workload.prepared_graphs(args):
        arms = {p: partial(_fit, graph, args, spec["batch_size"], precision=p) for p in PRECISIONS}
        runs, _ = harness.interleave(arms, args.rounds, spec["label"], alternate=True)
        summary = workload.summarise(runs, "32")
        row = {"graph": spec["label"] if spec["dataset"] == "tolokers" else f"synthetic {spec['label']}",
               "train_nodes": n_train, "time_ratio": summary["ratios"]["bf16-mixed"],
               "pair_ratios": summary["pair_ratios"]["bf16-mixed"]}
        for p in PRECISIONS:  # test_acc always; test_auc on binary labels (Tolokers)
            row[p] = {"epoch_s": summary["median_epoch_s"][p], "runs": runs[p], **{
                k: harness.median([r[k] for r in runs[p]]) for k in ("test_acc", "test_auc") if k in runs[p][0]}}
        results.append(row)
    markdown = harness.markdown_table(
        ["graph", "train nodes", "precision", "median epoch (s)", "vs 32", "each round", "test acc", "test ROC-AUC"],
        [[r["graph"], r["train_nodes"], p, f"{r[p]['epoch_s']:.3f}", f"{r[p]['epoch_s'] / r['32']['epoch_s']:.3f}x",
          " / ".join(f"{x:.3f}" for x in r["pair_ratios"]) if p != "32" else "", f"{r[p]['test_acc']:.4f}",
          f"{r[p]['test_auc']:.4f}" if "test_auc" in r[p] else ""] for r in results for p in PRECISIONS])
    return harness.report(args, {"results": results}, markdown, harness.bar_plot(
        {f"{r['graph']}\n{p}": r[p]["epoch_s"] for r in results for p in PRECISIONS}, "epoch time (s, 2 CPU ranks)"),
        figsize=(7, 4))


PYG_TARGET = 1.10
PYG_LABELS = {"blocks": "A: graphtrainer SAGE on DGL blocks", "pyg": "B: PyG GraphSAGE on PyG batches",
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


class PygOnBlocks(torch.nn.Module):
    """A PyG model called as ``workload.evaluate`` calls a model on DGL blocks (each turned into a PyG batch)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model, self.layers = model, model.convs

    def forward(self, blocks: Any, feat: Any) -> Any:
        batch = to_pyg(blocks)
        return self.model(batch.x, batch.edge_index)[:batch.batch_size]


def pyg_vs_blocks(argv: List[str]) -> Dict[str, Any]:
    """PyG's GraphSAGE on PyG batches (B) against graphtrainer's SAGE on DGL blocks (A), 200kx10.
    B-T (``--trim-arm``): PyG's per-layer trimming. Same task and DGL sampling, A B A B; median epoch,
    B / A and test accuracy with every neighbour. The GPU pair: ``tests/helpers/pyg_gpu_script.py --bench``."""
    p = harness.base_parser("pyg_vs_blocks", str(pyg_vs_blocks.__doc__), rounds=2, tiny=workload.TINY)
    p.add_argument("--trim-arm", action="store_true", help="add PyG's GraphSAGE with per-layer trimming (B-T)")
    args = workload.training_options(p, size="200kx10", max_train_nodes=10_000, epochs=3).parse_args(argv)
    ((spec, graph, n_train),) = workload.prepared_graphs(args)

    def run(arm: str, rnd: int) -> Dict[str, Any]:
        if arm == "blocks":
            return _fit(graph, args, None, rnd)
        task = PygBenchTask(graph, **workload.task_kwargs(args))
        task.trim = arm == "pyg_trim"
        res = workload.fit(graph, task, args.epochs, evaluate_test=False)
        return dict(res, **workload.evaluate(PygOnBlocks(task.module), graph, workload.split_ids(graph, "test")))

    arms = ["blocks", "pyg"] + (["pyg_trim"] if args.trim_arm else [])
    runs, order = harness.interleave({a: partial(run, a) for a in arms}, args.rounds, "pyg_vs_blocks")
    summary = workload.summarise(runs, "blocks", metric="test_acc")
    md = (f"# PyG batches vs DGL blocks ({spec['label']}, {n_train:,} training seeds, fanouts {args.fanouts}, "
          f"hidden {args.hidden}, batch {args.batch_size}, 2 CPU ranks, {args.rounds} rounds)\n\n"
          + workload.arms_table(summary, PYG_LABELS, "A") + f"\n\nTarget for B: at most {PYG_TARGET:.2f}x A's epoch.")
    payload = {"runs": runs, "order": order, **summary, "target": PYG_TARGET,
               "versions": {**harness.versions(), "torch_geometric": version("torch_geometric")}}
    return harness.report(args, payload, md, harness.bar_plot(
        {PYG_LABELS[a]: summary["median_epoch_s"][a] for a in arms}, "median epoch time (s)"), figsize=(8, 4))


class _TrainOnly:
    """Training only, its loader given ``loader_kwargs`` (the worker processes)."""

    loader_kwargs: Dict[str, Any] = {}

    def val_dataloader(self) -> Any:
        return None

    def node_dataloader(self, *args: Any, **kwargs: Any) -> Any:
        return super().node_dataloader(*args, **kwargs, **self.loader_kwargs)  # type: ignore[misc]


HomoTask = type("HomoTask", (_TrainOnly, NodeClassification), {})  # module-level names: picklable
HeteroTask = type("HeteroTask", (_TrainOnly, HeteroClassification), {})


def workers(argv: List[str]) -> Dict[str, Any]:
    """Sampling worker processes: training seeds/s with 0, 1 and 2 workers per rank (1M nodes).
    GraphSAGE on 2 forked ranks (``--hetero``: papers and words), 3 epochs of ``--batches``; epoch 0 starts them."""
    p = harness.base_parser("workers", str(workers.__doc__), tiny={"nodes": 5000, "batches": 2, "batch_size": 256})
    for flag, default in (("--nodes", 1_000_000), ("--batches", 40), ("--batch-size", 1024), ("--num-procs", 2)):
        p.add_argument(flag, type=int, default=default)  # --batches: training batches per rank and epoch
    p.add_argument("--hetero", action="store_true", help="synthetic_hetero: papers and words")
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--threads", type=int, default=None, help="threads_per_proc (default: cores // ranks)")
    p.add_argument("--root-dir", default="/tmp/graphtrainer-bench-workers")
    args = p.parse_args(argv)
    graph = (datasets.synthetic_hetero(args.nodes, max(args.nodes // 10, 8), avg_degree=10, feat_dim=64)
             if args.hetero else datasets.synthetic(args.nodes, 10, 64, 8))

    def run(n_workers: int, rnd: int) -> Dict[str, Any]:
        common = dict(fanouts=[10, 10], hidden=64, batch_size=args.batch_size)
        task = (HeteroTask(graph, embed_dim=16, layerwise_eval=False, **common) if args.hetero
                else HomoTask(graph, **common))
        task.loader_kwargs = {"num_workers": n_workers, "persistent_workers": True} if n_workers else {}
        times = workload.fit(graph, task, 3, evaluate_test=False, num_procs=args.num_procs, seed=None,
                             limit_train_batches=args.batches, default_root_dir=args.root_dir,
                             find_unused_parameters=args.hetero, threads_per_proc=args.threads)["epoch_times_s"]
        seeds = args.batches * args.batch_size * args.num_procs
        return {"workers": n_workers, "epoch_s": times, "seeds_per_s": [seeds / s for s in times]}

    runs, _ = harness.interleave({w: partial(run, w) for w in map(int, args.workers.split(","))}, 1, "workers")
    rows = [rs[0] for rs in runs.values()]
    steady = [harness.median(r["seeds_per_s"][1:]) for r in rows]
    table = harness.markdown_table(
        ["workers per rank", "epoch 0 seeds/s (starts workers)", "epochs 1-2 seeds/s", "vs 0 workers"],
        [[r["workers"], f"{r['seeds_per_s'][0]:,.0f}", f"{s:,.0f}", f"{s / steady[0]:.2f}x"]
         for r, s in zip(rows, steady)])
    return harness.report(args, {"runs": rows}, table)


NN_ARMS = {"dgl.nn": "dgl", "graphtrainer.nn": "dgl", "torch blocks": "torch"}  # arm: its block type
NN_TIMES = {"epoch_s": "time_ratio", "epoch_min_s": "min_time_ratio", "epoch_cpu_s": "cpu_ratio"}


class NnTask(workload.BenchTask):
    """The benchmark task with ``arm``'s model, the same initial weights in every arm for one ``model_seed``."""

    arm, model_seed = "torch blocks", 0

    def configure_model(self) -> Any:
        torch.manual_seed(self.model_seed)
        model = super().configure_model()
        if self.arm == "dgl.nn":  # dgl.nn's SAGEConv layers, loaded with graphtrainer's (same names and shapes)
            import dgl.nn  # after graphtrainer, which lets DGL load without GraphBolt on the newest stack

            sizes = [self.in_feats] + [self.hidden] * (len(self.fanouts) - 1) + [self.num_classes]
            layers = torch.nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
            layers.load_state_dict(model.layers.state_dict())
            model.layers = layers
        return model


def nn(argv: List[str]) -> Dict[str, Any]:
    """graphtrainer.nn on DGL blocks and on torch-only blocks against dgl.nn: epoch wall and CPU time, 50kx10.
    2 CPU ranks of 1 thread; round k runs seed k, every arm from the same initial weights; test accuracy."""
    p = harness.base_parser("nn", str(nn.__doc__), tiny={"size": workload.parse_size("3kx5"), "max_train_nodes": 600,
                                                         "epochs": 2, "seeds": [0], "batch_size": 128, "hidden": 16})
    workload.training_options(p, size="50kx10", max_train_nodes=8_000, epochs=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=list(NN_ARMS), default=list(NN_ARMS))
    args = p.parse_args(argv)
    ((spec, graph, n_train),) = workload.prepared_graphs(args)

    def run(arm: str, rnd: int) -> Dict[str, Any]:
        task = NnTask(graph, **workload.task_kwargs(args))
        task.arm, task.model_seed = arm, args.seeds[rnd]
        # One thread per rank: 2 ranks fill the 2 cores, and DGL's sampling is repeatable with one thread.
        res = workload.fit(graph, task, args.epochs, block_type=NN_ARMS[arm], threads_per_proc=1, seed=args.seeds[rnd])
        wall, cpu = workload.steady(res["epoch_times_s"]), workload.steady(res["epoch_cpu_times_s"])
        return dict(res, epoch_s=harness.median(wall), epoch_min_s=min(wall), epoch_cpu_s=harness.median(cpu))

    runs, _ = harness.interleave({a: partial(run, a) for a in args.arms}, len(args.seeds), "nn", lambda r: (
        f"epoch {r['epoch_s']:.3f} s wall, {r['epoch_cpu_s']:.3f} s CPU, test_acc {r['test_acc']:.4f}"), alternate=True)
    base = args.arms[0]
    out = {arm: {"test_acc": [r["test_acc"] for r in rs], "runs": rs} for arm, rs in runs.items()}
    for arm, m in out.items():
        # Per-seed ratios (same seed, adjacent runs) are less exposed to the machine's load drifting.
        for k, ratio in NN_TIMES.items():
            m[k] = harness.median([r[k] for r in runs[arm]])
            m[ratio] = harness.median([r[k] / b[k] for r, b in zip(runs[arm], runs[base])])
        m["test_acc_mean"] = sum(m["test_acc"]) / len(m["test_acc"])
    md = (f"2 CPU ranks (1 thread each), {spec['label']}, {n_train:,} training seeds, seeds {args.seeds}, "
          f"{args.epochs - 1} timed epochs per run: rank 0's epoch, median wall (and fastest) and CPU time, as the "
          f"median over seeds of arm / {base} (target for torch blocks <= 1.10x); test accuracy, every neighbour\n\n"
          + harness.markdown_table(
              ["arm", "epoch wall (s)", f"wall vs {base}", f"fastest epoch vs {base}", "epoch CPU (s)",
               f"CPU vs {base}", "test acc per seed", "mean test acc"],
              [[arm, f"{m['epoch_s']:.3f}", harness.fmt_ratio(m["time_ratio"]), harness.fmt_ratio(m["min_time_ratio"]),
                f"{m['epoch_cpu_s']:.3f}", harness.fmt_ratio(m["cpu_ratio"]),
                ", ".join(f"{a:.4f}" for a in m["test_acc"]), f"{m['test_acc_mean']:.4f}"] for arm, m in out.items()]))
    return harness.report(args, {"train_nodes": n_train, "baseline": base, "arms": out}, md, harness.bar_plot(
        {f"{k}\n{m}": v[f"epoch{m}_s"] for k, v in out.items() for m in ("", "_cpu")}, "rank 0 epoch (s): wall, CPU"),
        figsize=(7, 4))


VENVS = {"pinned": harness.ROOT / ".venv", "newest": harness.ROOT / ".venv-newest"}


def stacks(argv: List[str]) -> Dict[str, Any]:
    """The newest tested set against the pinned one: the same task, graph and seeds under each set's interpreter
    in turn, median epoch newest / pinned per ``--dropouts`` value, and the ops behind dropout (Tolokers)."""
    p = harness.base_parser("stacks", str(stacks.__doc__), rounds=3, worker=stacks_run,
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
    args = p.parse_args(argv)
    pythons = {s: getattr(args, f"{s}_python") for s in VENVS}
    for stack, python in pythons.items():
        if not python.exists():
            raise SystemExit(f"error: {python} is missing: make it with "
                             f"GRAPHTRAINER_STACK={stack} bash scripts/env.sh true")
    cfg = {"dataset": args.dataset, "num_nodes": args.num_nodes, "epochs": args.epochs, "num_procs": args.num_procs}
    arms = {f"{s} {d}": (lambda rnd, s=s, d=d: harness.run_worker(
        [str(pythons[s]), __file__, "stacks"], dict(cfg, dropout=d), f"the {s} run", 1800))
        for d in args.dropouts for s in VENVS}
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


def stacks_run(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """One training run in this interpreter: epoch times, versions and the ops behind dropout, ms per call
    on one thread for about a Tolokers batch's hidden layer."""
    import dgl
    import torch.nn.functional as F
    from torch.utils.benchmark import Timer

    from graphtrainer.nn.dropout import dropout

    spec = ({"dataset": "tolokers"} if cfg["dataset"] == "tolokers" else
            {"dataset": "synthetic", "num_nodes": cfg["num_nodes"], "avg_degree": 10, "feat_dim": 64})
    graph = workload.build_graph(spec)
    task = workload.BenchTask(graph, fanouts=[10, 10], hidden=128, batch_size=256, lr=3e-3, dropout=cfg["dropout"])
    res = workload.fit(graph, task, cfg["epochs"], evaluate_test=False, num_procs=cfg["num_procs"],
                       enable_model_summary=None)
    x = torch.randn(3000, 128)
    ops = {"F.dropout": lambda: F.dropout(x, 0.5, True), "bernoulli_": lambda: torch.empty_like(x).bernoulli_(0.5),
           "rand_like": lambda: torch.rand_like(x), "graphtrainer.nn.Dropout": lambda: dropout(x, 0.5)}
    ops_ms = {k: Timer("op()", globals={"op": op}, num_threads=1).timeit(50).mean * 1e3 for k, op in ops.items()}
    return {"epoch_times_s": res["epoch_times_s"], "torch": torch.__version__, "dgl": dgl.__version__,
            "dropout": cfg["dropout"], "ops_ms": ops_ms}


COMPARISONS: Dict[str, Callable[[List[str]], Dict[str, Any]]] = {
    "precision": precision, "pyg_vs_blocks": pyg_vs_blocks, "workers": workers, "nn": nn, "stacks": stacks}


def main(argv: Any = None) -> Dict[str, Any]:
    return harness.subcommands(__doc__, COMPARISONS, argv)


if __name__ == "__main__":
    main()
