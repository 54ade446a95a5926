"""Framework vs hand-written DDP: the same GraphSAGE training as a tutorial-style script and
as a graphtrainer GraphTask, 2 ranks, interleaved A B A B, median epoch time and accuracy.

    bash scripts/env.sh python benchmarks/overhead.py
    bash scripts/env.sh python benchmarks/overhead.py --tiny

A (hand-written, ``common.handwritten_rank``): the parent pickles the graph and spawns the
ranks (as DGL's classic multi-GPU node-classification tutorial does with mp.spawn), each
rank runs init_process_group("gloo"), DistributedDataParallel, DGL's
``DataLoader(use_ddp=True)`` and calls ``loss.item()`` every step. Threads per rank are set
to cores // ranks, the same as the trainer does, so neither side oversubscribes the cores.
B (graphtrainer): ``Trainer(num_procs=2)`` (fork) on ``common.BenchTask`` (the example
``NodeClassification`` task without validation). Same SAGE, Adam, fanouts, batch size,
epochs, seed-node set. Epoch time is rank 0's wall time of the training loop of one epoch
(graphtrainer: on_train_epoch_start to on_train_epoch_end, so it includes the trainer's
metric reduction). The first epoch of every run is warm-up and left out of the median.
Accuracy: the trained model on the test split with every neighbour, same function for both.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402

NAME = "overhead"


class EpochTimer(Callback):
    """Rank 0's training-loop time per epoch; travels back to the caller as callback state."""

    def __init__(self) -> None:
        self.times: List[float] = []
        self.steps: List[int] = []
        self._t0 = 0.0
        self._n = 0

    def state_dict(self) -> Dict[str, Any]:
        return {"times": list(self.times), "steps": list(self.steps)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.times, self.steps = list(state["times"]), list(state["steps"])

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self._t0, self._n = time.perf_counter(), 0

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._n += 1

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self.steps.append(self._n)


def parse_args(argv: Any = None) -> Any:
    p = common.base_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", choices=common.DATASETS, default=list(common.DATASETS))
    p.add_argument("--size", type=common.parse_size, default=common.parse_size("1Mx10"), help="synthetic graph")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--max-train-nodes", type=int, default=60_000,
                   help="cap the training seeds (same ids for both) so an epoch takes seconds")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2, help="A B pairs, interleaved")
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    if args.tiny:
        args.size = common.parse_size("20kx5")
        if "--datasets" not in (argv or sys.argv):
            args.datasets = ["synthetic"]
        args.feat_dim, args.hidden, args.batch_size, args.max_train_nodes = 16, 32, 256, 2048
        args.epochs, args.rounds = 2, 1
    if args.world < 1 or args.epochs < 1 or args.rounds < 1:
        p.error("--world, --epochs and --rounds must be >= 1")
    return args


def cap_train(graph: Any, cap: int, seed: int = 0) -> int:
    import torch

    ids = common.split_ids(graph, "train")
    if ids.numel() > cap:
        keep = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))[:cap]]
        mask = torch.zeros_like(graph.ndata["train_mask"])
        mask[keep] = True
        graph.ndata["train_mask"] = mask
    return int(graph.ndata["train_mask"].sum())


def run_handwritten(graph: Any, args: Any, batch_size: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hand.json")
        cfg = {"fanouts": [int(f) for f in args.fanouts.split(",")], "hidden": args.hidden,
               "batch_size": batch_size, "lr": args.lr, "dropout": 0.5, "epochs": args.epochs,
               "threads": max(1, (os.cpu_count() or 1) // args.world), "seed": 0, "out_file": out}
        t = time.perf_counter()
        common.naive_spawn(graph, args.world, cfg)
        res = json.loads(Path(out).read_text())
        res["run_wall_s"] = time.perf_counter() - t
        return res


def run_graphtrainer(graph: Any, args: Any, batch_size: int) -> Dict[str, Any]:
    from graphtrainer import Trainer

    timer = EpochTimer()
    task = common.BenchTask(graph, fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                            batch_size=batch_size, lr=args.lr, dropout=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(num_procs=args.world, max_epochs=args.epochs, progress_bar=False, logger=False,
                          default_root_dir=tmp, callbacks=[timer])
        t = time.perf_counter()
        trainer.fit(task)
        wall = time.perf_counter() - t
    acc = common.evaluate_accuracy(task.module, graph, common.split_ids(graph, "test"))
    return {"epoch_times_s": timer.times, "steps_per_epoch": timer.steps, "test_acc": acc, "run_wall_s": wall}


def steady(times: List[float]) -> List[float]:
    return times[1:] if len(times) > 1 else times


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    specs = []
    for ds in args.datasets:
        if ds == "synthetic":
            s = args.size
            specs.append({"dataset": "synthetic", "label": common.size_label(s), "num_nodes": s["num_nodes"],
                          "avg_degree": s["avg_degree"], "num_edges": s["num_nodes"] * s["avg_degree"],
                          "feat_dim": args.feat_dim, "num_classes": 8, "seed": 0, "batch_size": args.batch_size})
        else:
            specs.append({"dataset": "tolokers", "label": "tolokers", "num_nodes": 11_758, "num_edges": 1_038_000,
                          "feat_dim": 10, "batch_size": min(args.batch_size, 256)})
    common.refuse_if_too_big([{"label": s["label"], "estimate_mb": common.estimate_mb(
        s["num_nodes"], s["num_edges"], s["feat_dim"], "naive-spawn", args.world)} for s in specs])
    machine = common.machine_info()
    t_start = time.time()
    results: List[Dict[str, Any]] = []
    for spec in specs:
        graph = common.build_graph(spec)
        n_train = cap_train(graph, args.max_train_nodes)
        graph.create_formats_()  # both sides sample from the same prepared structure
        runs: Dict[str, List[Dict[str, Any]]] = {"handwritten": [], "graphtrainer": []}
        order = []
        for rnd in range(args.rounds):
            for name, fn in (("handwritten", run_handwritten), ("graphtrainer", run_graphtrainer)):
                load = round(os.getloadavg()[0], 2)
                print(f"[{NAME}] {spec['label']} round {rnd + 1}/{args.rounds}: {name} (load {load})", flush=True)
                res = fn(graph, args, spec["batch_size"])
                res["loadavg_1min_before"] = load
                runs[name].append(res)
                order.append(name)
                print(f"    epochs {[round(t, 2) for t in res['epoch_times_s']]}  test acc {res['test_acc']:.4f}",
                      flush=True)
        med = {k: common.median([t for r in v for t in steady(r["epoch_times_s"])]) for k, v in runs.items()}
        # Pairwise ratios: each B run against the A run just before it.
        pairs = [common.median(steady(b["epoch_times_s"])) / common.median(steady(a["epoch_times_s"]))
                 for a, b in zip(runs["handwritten"], runs["graphtrainer"])]
        steps = runs["graphtrainer"][0].get("steps_per_epoch", [0])[0]
        results.append({
            "graph": spec["label"], "train_nodes": n_train, "batch_size": spec["batch_size"], "order": order,
            "steps_per_epoch_per_rank": steps, "runs": runs,
            "median_epoch_s": med, "ratio": med["graphtrainer"] / med["handwritten"], "pair_ratios": pairs,
            "ms_per_step": {k: 1000 * v / max(steps, 1) for k, v in med.items()},
            "test_acc": {k: [r["test_acc"] for r in v] for k, v in runs.items()},
        })
        del graph
    rows = [[r["graph"], r["train_nodes"], r["steps_per_epoch_per_rank"], r["median_epoch_s"]["handwritten"],
             r["median_epoch_s"]["graphtrainer"], common.fmt_ratio(r["ratio"]),
             " / ".join(common.fmt_ratio(x) for x in r["pair_ratios"]),
             r["ms_per_step"]["handwritten"], r["ms_per_step"]["graphtrainer"],
             " / ".join(f"{a:.4f}" for a in r["test_acc"]["handwritten"]),
             " / ".join(f"{a:.4f}" for a in r["test_acc"]["graphtrainer"]),
             "yes" if r["ratio"] <= 1.03 else "**no**"] for r in results]
    md = common.markdown_table(["graph", "train seeds", "steps/epoch/rank", "hand-written epoch s (median)",
                                "graphtrainer epoch s (median)", "ratio", "per-pair ratios",
                                "hand-written ms/step", "graphtrainer ms/step", "hand-written test acc",
                                "graphtrainer test acc", "<= 1.03x"], rows)

    def draw(fig: Any) -> None:
        for i, r in enumerate(results):
            ax = fig.add_subplot(1, len(results), i + 1)
            data = [[t for run in r["runs"][k] for t in steady(run["epoch_times_s"])] for k in ("handwritten", "graphtrainer")]
            ax.boxplot(data, labels=["hand-written", "graphtrainer"])
            ax.set_ylabel("epoch time (s), warm-up epochs excluded")
            ax.set_title(f"{r['graph']}: ratio {r['ratio']:.3f}x, {args.world} ranks", fontsize=9)

    payload = {"benchmark": NAME, "machine": machine, "versions": common.versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "wall_s": round(time.time() - t_start, 1), "results": results,
               "targets": [{"graph": r["graph"], "what": "graphtrainer / hand-written median epoch time",
                            "measured": r["ratio"], "target": "<= 1.03", "met": r["ratio"] <= 1.03} for r in results]}
    paths = common.write_outputs(args.out, NAME, payload, md, draw)
    print(md)
    print(f"[{NAME}] wrote {', '.join(str(p) for p in paths.values())}")
    return payload


if __name__ == "__main__":
    main()
