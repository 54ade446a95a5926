"""Framework vs hand-written DDP, interleaved rounds: the same GraphSAGE training (model, optimizer, seeds, initial
weights) as ``workload.handwritten_rank``'s tutorial-style DDP and as ``Trainer(num_procs=2)`` on ``BenchTask``.

    python benchmarks/overhead.py --datasets tolokers                  # the issue's figure
    python benchmarks/overhead.py --join-arm --thread-arm --stop-arm   # ablations
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Dict, List
from unittest import mock

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import probe
import workload

TARGET = 1.03
ACC_TOLERANCE = 0.01  # "equal metric": mean test metrics within 1 point (absolute)


def run_handwritten(graph: Any, args: Any, batch_size: int, **cfg: Any) -> Dict[str, Any]:
    cfg.update(workload.task_kwargs(args, batch_size), epochs=args.epochs, seed=0, evaluate=True,
               threads=max(1, harness.available_cores() // args.world))
    started = time.perf_counter()
    return dict(workload.naive_spawn(graph, args.world, cfg), run_wall_s=time.perf_counter() - started)


def run_graphtrainer(graph: Any, args: Any, batch_size: int, stop: bool = True) -> Dict[str, Any]:
    """``stop=False``: the stop agreement patched out here, before the ranks fork and inherit it."""
    from graphtrainer.loop.preemption import StopAgreement

    task = workload.BenchTask(graph, **workload.task_kwargs(args, batch_size))
    no_stop = mock.patch.object(StopAgreement, "at_boundary", lambda self, *rest: False)
    with contextlib.nullcontext() if stop else no_stop:
        return workload.fit(graph, task, args.epochs, num_procs=args.world, enable_model_summary=None)


ARMS = {"handwritten": ("hand-written", run_handwritten),
        "handwritten_join": ("hand-written + Join", functools.partial(run_handwritten, join=True)),
        "handwritten_thread": ("hand-written in a new thread", functools.partial(run_handwritten, fresh_thread=True)),
        "graphtrainer": ("graphtrainer", run_graphtrainer),
        "graphtrainer_no_stop": ("graphtrainer without the stop agreement",
                                 functools.partial(run_graphtrainer, stop=False))}
OPTIONAL = {"handwritten_join": "join_arm", "handwritten_thread": "thread_arm", "graphtrainer_no_stop": "stop_arm"}


def step_and_fixed_ms(runs: List[Dict[str, Any]]) -> Dict[str, float]:
    """Each kept epoch split into a step (the mean interval between step ends, fetching the next batch
    included) and a fixed cost (epoch - steps x step: set-up before the first batch, what follows the last)."""
    kept = [(total, ends) for run in runs for total, ends in list(zip(run["epoch_times_s"], run["step_ends_s"]))[1:]
            if len(ends) > 1]
    steps = [(ends[-1] - ends[0]) / (len(ends) - 1) for _, ends in kept]
    fixed = [total - len(ends) * step for (total, ends), step in zip(kept, steps)]
    return {"step_ms": 1000 * harness.median(steps), "epoch_fixed_ms": 1000 * harness.median(fixed)}


def analyse(spec: Dict[str, Any], n_train: int, runs: Dict[str, List[Dict[str, Any]]], order: List[str],
            world: int) -> Dict[str, Any]:
    summary = workload.summarise(runs, "handwritten")
    ratio, pairs = summary["ratios"]["graphtrainer"], summary["pair_ratios"]
    diff = summary["mean_score"]["graphtrainer"] - summary["mean_score"]["handwritten"]
    out = dict(summary, graph=spec["label"], train_nodes=n_train, batch_size=spec["batch_size"], world=world,
               order=order, steps_per_epoch_per_rank=runs["graphtrainer"][0]["steps_per_epoch"][-1], runs=runs,
               ratio=ratio, costs={k: step_and_fixed_ms(v) for k, v in runs.items()}, metric_diff=diff,
               met=ratio <= TARGET and abs(diff) <= ACC_TOLERANCE)
    if "graphtrainer_no_stop" in runs:  # the agreement alone: graphtrainer / graphtrainer without it
        out["stop_ratio"] = ratio / summary["ratios"]["graphtrainer_no_stop"]
        out["stop_pair_ratios"] = [a / b for a, b in zip(pairs["graphtrainer"], pairs["graphtrainer_no_stop"])]
    return out


def render(results: List[Dict[str, Any]], args: Any) -> str:
    parts = []
    for r in results:
        costs = "; ".join(f"{ARMS[k][0]} {c['step_ms']:.2f} ms/step, {c['epoch_fixed_ms']:.0f} ms/epoch fixed"
                          for k, c in r["costs"].items())
        stop = (f" The stop agreement alone: {r['stop_ratio']:.3f}x (each round "
                + " / ".join(f"{x:.3f}" for x in r["stop_pair_ratios"]) + ").") if "stop_ratio" in r else ""
        parts += [f"**{r['graph']}**: {r['train_nodes']} training seeds, {r['steps_per_epoch_per_rank']} steps per "
                  f"epoch per rank, batch {r['batch_size']}, {r['world']} ranks",
                  workload.arms_table(r, {k: label for k, (label, _) in ARMS.items()}, "hand-written"),
                  f"graphtrainer / hand-written {r['ratio']:.3f}x, {r['metric']} difference {r['metric_diff']:+.4f}; "
                  f"<= {TARGET}x with equal metric: {'yes' if r['met'] else '**no**'}"
                  f"{harness.noise_note(r['other_cores'])}. {costs}.{stop}"]
    parts.append(f"Median epoch over every run's epochs but its first ({args.rounds} run(s) of {args.epochs} epochs "
                 f"per arm, interleaved); equal metric: mean test metrics within {ACC_TOLERANCE}. ms/step: the mean "
                 "interval between step ends in an epoch; fixed: epoch - steps x ms/step (medians over epochs).")
    return "\n\n".join(parts)


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("overhead", __doc__, rounds=3, tiny=workload.TINY)
    workload.training_options(p, feat_dim=64, epochs=6, datasets=workload.DATASETS)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--join-arm", action="store_true", help="add the hand-written loop inside Join")
    p.add_argument("--thread-arm", action="store_true", help="add the hand-written loop in a new thread per rank")
    p.add_argument("--stop-arm", action="store_true", help="add graphtrainer without its preemption agreement")
    args = p.parse_args(argv)
    if min(args.world, args.epochs, args.rounds) < 1:
        p.error("--world, --epochs and --rounds must be >= 1")
    probe.refuse_if_too_big([{"label": s["label"], "estimate_mb": probe.estimate_mb(
        s["num_nodes"], s["num_edges"], s["feat_dim"], "naive-spawn", args.world)}
        for s in workload.graph_specs(args.datasets, [args.size], args.feat_dim, args.batch_size)])
    arms = [k for k in ARMS if k not in OPTIONAL or getattr(args, OPTIONAL[k])]
    results = []
    for spec, graph, n_train in workload.prepared_graphs(args):
        runs, order = harness.interleave(
            {k: (lambda rnd, k=k: ARMS[k][1](graph, args, spec["batch_size"])) for k in arms}, args.rounds,
            spec["label"], lambda res: f"epochs {[round(t, 2) for t in res['epoch_times_s']]} test acc "
                                       f"{res['test_acc']:.4f}, run {res['run_wall_s']:.1f} s")
        results.append(analyse(spec, n_train, runs, order, args.world))
        graph = None  # freed before the next graph is built
    targets = [{"graph": r["graph"], "what": f"graphtrainer / hand-written epoch <= {TARGET}, equal test metric",
                "measured": r["ratio"], "met": r["met"], "valid": r["other_cores"] <= harness.NOISY_CORES}
               for r in results]
    epochs = {f"{r['graph']}\n{ARMS[k][0]}": v for r in results for k, v in r["median_epoch_s"].items()}
    plot = harness.bar_plot(epochs, f"median epoch time (s), {args.world} ranks")
    return harness.report(args, {"results": results, "targets": targets}, render(results, args), plot)


if __name__ == "__main__":
    main()
