"""DGL's multi-GPU tutorial script (``dgl_tutorial.py``) against the same job as a GraphTask with every default
(``--port``: ``Trainer(num_procs=NPROCS)``, the tutorial's network, sampler, batch and Adam), each run a fresh
process on the same graph file, interleaved: rank 0's mean epoch over epochs 2..E and the tree's peak PSS.

    python benchmarks/tutorial_vs_task.py --datasets tolokers --world-sizes 2   # the issue's figure
    python benchmarks/tutorial_vs_task.py --port GRAPH.bin NPROCS EPOCHS OUT.json [OPTION=VALUE ...]  # one run

``--port``: rank 0 writes its epoch starts to OUT.json; OPTION=VALUE (``profiler=simple``) sets a Trainer option."""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import workload
import dgl
from dgl_tutorial import HIDDEN, Model
from graphtrainer import Trainer
from graphtrainer.callbacks import Callback
from graphtrainer.examples.node_classification import NodeClassification

EPOCH_TARGETS = {1: 0.90, 2: 0.95, 4: 0.95}  # epoch time B / A at most, by rank count
PSS_TARGET = 0.85  # peak total PSS B / A at most
ARMS = {"tutorial": ["dgl_tutorial.py"], "graphtrainer": ["tutorial_vs_task.py", "--port"]}
YES_NO = {True: "yes", False: "**no**"}


class TutorialTask(NodeClassification):
    """The tutorial's model, sampler, batch size and optimizer; training only."""

    def __init__(self, graph: Any):
        super().__init__(graph, fanouts=[4, 4], hidden=HIDDEN, batch_size=1024, lr=1e-3)

    def configure_model(self) -> Any:
        return Model(self.in_feats, self.hidden, self.num_classes)

    def val_dataloader(self) -> Any:
        return None


class EpochStarts(Callback):
    """Rank 0 writes its epoch starts and the fit's end to ``out``, as ``dgl_tutorial.py`` does."""

    def __init__(self, out: str):
        self.out, self.starts = out, []

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        if trainer.rank == 0:
            Path(self.out).write_text(json.dumps({"epoch_starts": self.starts, "end": time.perf_counter(),
                                                  "steps_per_epoch": trainer.num_training_batches}))


def port(graph_file: str, nprocs: str, epochs: str, out: str, *options: str) -> None:
    """One run of the port (in this process and its ranks)."""
    (graph,), _ = dgl.load_graphs(graph_file)
    kwargs = {k: {"true": True, "false": False}.get(v, v) for k, v in (o.split("=", 1) for o in options)}
    with tempfile.TemporaryDirectory() as root:
        Trainer(num_procs=int(nprocs), max_epochs=int(epochs), default_root_dir=root,
                callbacks=[EpochStarts(out)], **kwargs).fit(TutorialTask(graph))


def run_arm(arm: str, graph_file: str, world: int, epochs: int, rnd: int) -> Dict[str, Any]:
    """One run in a fresh process: its epoch times (from rank 0's JSON), peak total PSS of its tree."""
    out = graph_file + f".{arm}.json"
    script, *mode = ARMS[arm]
    run = harness.run_process([sys.executable, str(Path(__file__).parent / script), *mode, graph_file, str(world),
                               str(epochs), out], f"{arm} with {world} rank(s)", peak_pss=True)
    data = json.loads(Path(out).read_text())
    os.remove(out)
    epoch_s = [b - a for a, b in zip(data["epoch_starts"], data["epoch_starts"][1:] + [data["end"]])]
    return {"epoch_s": epoch_s, "mean_epoch_s": statistics.fmean(epoch_s[1:]), "run_wall_s": run["wall_s"],
            "steps_per_epoch": data["steps_per_epoch"], "peak_total_pss_mb": run["peak_total_pss_mb"]}


def analyse(label: str, n_train: int, world: int, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """One row: each arm's mean over rounds, graphtrainer / tutorial, and the targets met."""
    mean = {k: statistics.fmean(r["mean_epoch_s"] for r in v) for k, v in runs.items()}
    pss = {k: statistics.fmean(r["peak_total_pss_mb"] for r in v) for k, v in runs.items()}
    epoch_ratio, pss_ratio = mean["graphtrainer"] / mean["tutorial"], pss["graphtrainer"] / pss["tutorial"]
    target = EPOCH_TARGETS.get(world, 0.95)
    pair_ratios = [b["mean_epoch_s"] / a["mean_epoch_s"] for a, b in zip(runs["tutorial"], runs["graphtrainer"])]
    return dict(epoch_ratio=epoch_ratio, pss_ratio=pss_ratio, graph=label, train_nodes=n_train, world=world,
                mean_epoch_s=mean, peak_total_pss_mb=pss, pair_ratios=pair_ratios,
                steps_per_epoch_rank0=runs["graphtrainer"][0]["steps_per_epoch"],
                other_cores=statistics.fmean(r["other_cores"] for v in runs.values() for r in v),
                epoch_target=target, met_epoch=epoch_ratio <= target, met_pss=pss_ratio <= PSS_TARGET)


def render(rows: List[Dict[str, Any]], args: Any) -> str:
    body = [[r["graph"], r["world"], r["steps_per_epoch_rank0"], *(round(r["mean_epoch_s"][arm], 3) for arm in ARMS),
             f"{r['epoch_ratio']:.2f}x", " / ".join(f"{x:.2f}" for x in r["pair_ratios"]),
             f"<= {r['epoch_target']:.2f}x: {YES_NO[r['met_epoch']]}{harness.noise_note(r['other_cores'])}",
             *(r["peak_total_pss_mb"][arm] for arm in ARMS), f"{r['pss_ratio']:.2f}x", YES_NO[r["met_pss"]]]
            for r in rows]
    return harness.markdown_table(
        ["graph", "ranks", "steps/epoch (rank 0)", "tutorial s/epoch", "graphtrainer s/epoch", "epoch ratio",
         "each round", "target", "tutorial peak PSS MB", "graphtrainer peak PSS MB", "PSS ratio", f"<= {PSS_TARGET}x"],
        body) + (f"\n\nMean epoch time over epochs 2-{args.epochs} of each run, then the mean over {args.rounds} "
                 "interleaved run(s) per arm; ratio = graphtrainer / tutorial. Peak PSS: the whole process tree's.")


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("tutorial_vs_task", __doc__, rounds=2, tiny={
        **workload.TINY, "max_train_nodes": 4096, "world_sizes": [1, 2]})
    p.add_argument("--datasets", nargs="+", choices=workload.DATASETS, default=list(workload.DATASETS))
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("1Mx10"), help="NODESxDEGREE")
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--max-train-nodes", type=int, default=60_000, help="cap the training seeds (same in both arms)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--epochs", type=int, default=6, help="per run; epoch 1 is warm-up (default %(default)s)")
    args = p.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1 or min(args.world_sizes) < 1:
        p.error("--epochs must be >= 2 (the first is warm-up), --rounds and --world-sizes >= 1")
    rows: List[Dict[str, Any]] = []
    raw: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tutorial-vs-task-") as tmp:
        for spec in workload.graph_specs(args.datasets, [args.size], args.feat_dim):
            path, label = os.path.join(tmp, f"{spec['label']}.bin"), spec["label"]
            graph = workload.build_graph(spec)
            n_train = workload.cap_train(graph, args.max_train_nodes)  # a seeded sample, the same in both arms
            for split in ("val", "test"):
                graph.ndata[f"{split}_mask"] = graph.ndata[f"{split}_mask"].bool()
            dgl.save_graphs(path, [graph])
            del graph  # each run loads the file
            flat, _ = harness.interleave(
                {f"{arm} x{w}": functools.partial(run_arm, arm, path, w, args.epochs) for w in args.world_sizes
                 for arm in ARMS}, args.rounds, label,
                lambda res: f"epochs {[round(t, 3) for t in res['epoch_s']]}, peak PSS {res['peak_total_pss_mb']} MB")
            raw[label] = {arm: {w: flat[f"{arm} x{w}"] for w in args.world_sizes} for arm in ARMS}
            rows += [analyse(label, n_train, w, {arm: raw[label][arm][w] for arm in ARMS}) for w in args.world_sizes]
            os.remove(path)
    ratios = {f"{r['graph']} x{r['world']}\n{k}": r[f"{k}_ratio"] for r in rows for k in ("epoch", "pss")}
    plot = harness.bar_plot(ratios, "graphtrainer / tutorial")
    return harness.report(args, {"results": rows, "runs": raw}, render(rows, args), plot, figsize=(10, 4))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--port"]:
        port(*sys.argv[2:])
    else:
        main()
