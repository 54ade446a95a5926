"""graphtrainer.nn on torch-only blocks against dgl.nn on DGL blocks (2 CPU ranks, interleaved per
seed) and, where CUDA exists, the seeds/s of 1 GPU rank against 2 CPU ranks.

    python benchmarks/gpu.py --out benchmarks/results/gpu                    # CPU part (+ GPU part on a GPU)
    python benchmarks/gpu.py --gpu-only --out benchmarks/results/gpu/h100    # on a GPU machine
"""
from __future__ import annotations

from typing import Any, Dict

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import workload

ARMS = {"dgl.nn": "dgl", "graphtrainer.nn": "dgl", "torch blocks": "torch"}  # arm: its block type
TIMES = ("epoch_s", "epoch_min_s", "epoch_cpu_s")  # rank 0's epoch: wall (median, fastest), CPU (median)


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("gpu", __doc__, tiny={"size": workload.parse_size("3kx5"), "max_train_nodes": 600,
                                                  "epochs": 2, "seeds": [0], "batch_size": 128, "hidden": 16})
    workload.training_options(p, size="50kx10", max_train_nodes=8_000, epochs=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--gpu-only", action="store_true", help="skip the CPU part (the GPU part has its own CPU baseline)")
    return p.parse_args(argv)


class ArmTask(workload.BenchTask):
    """The benchmark task with ``arm``'s model, the same initial weights in every arm for one ``model_seed``."""

    arm, model_seed = "torch blocks", 0

    def configure_model(self) -> Any:
        import torch

        torch.manual_seed(self.model_seed)
        model = super().configure_model()
        if self.arm == "dgl.nn":  # dgl.nn's SAGEConv layers, loaded with graphtrainer's (same names and shapes)
            import dgl.nn

            sizes = [self.in_feats] + [self.hidden] * (len(self.fanouts) - 1) + [self.num_classes]
            layers = torch.nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
            layers.load_state_dict(model.layers.state_dict())
            model.layers = layers
        return model


def run_arm(graph: Any, arm: str, seed: int, args: Any, **trainer_kwargs: Any) -> Dict[str, Any]:
    task = ArmTask(graph, **workload.task_kwargs(args))
    task.arm, task.model_seed = arm, seed
    # One thread per rank: 2 ranks fill the 2 cores, and DGL's sampling is repeatable with one thread.
    res = workload.fit(graph, task, args.epochs,
                       **{"block_type": ARMS[arm], "threads_per_proc": 1, "seed": seed, **trainer_kwargs})
    wall, cpu = workload.steady(res["epoch_times_s"]), workload.steady(res["epoch_cpu_times_s"])
    return dict(res, epoch_s=harness.median(wall), epoch_min_s=min(wall), epoch_cpu_s=harness.median(cpu))


def cpu_part(graph: Any, args: Any) -> Dict[str, Any]:
    runs, _ = harness.interleave(  # round k runs seed k, every arm from the same weights
        {arm: (lambda k, arm=arm: run_arm(graph, arm, args.seeds[k], args)) for arm in args.arms}, len(args.seeds),
        "gpu", lambda r: f"epoch {r['epoch_s']:.3f} s wall, {r['epoch_cpu_s']:.3f} s CPU, test_acc {r['test_acc']:.4f}",
        alternate=True)
    out: Dict[str, Any] = {}
    for arm, arm_runs in runs.items():
        # Per-seed ratios (same seed, adjacent runs) are less exposed to the machine's load drifting.
        ratio = {k: harness.median([r[k] / b[k] for r, b in zip(arm_runs, runs[args.arms[0]])]) for k in TIMES}
        accs = [r["test_acc"] for r in arm_runs]
        out[arm] = dict({k: harness.median([r[k] for r in arm_runs]) for k in TIMES}, test_acc=accs, runs=arm_runs,
                        test_acc_mean=sum(accs) / len(accs), time_ratio=ratio["epoch_s"],
                        min_time_ratio=ratio["epoch_min_s"], cpu_ratio=ratio["epoch_cpu_s"])
    return out


def gpu_part(graph: Any, args: Any, n_train: int) -> Dict[str, Any]:
    # The CPU ranks run as a CPU user would (DGL blocks); the GPU rank as "auto" picks (torch blocks).
    # Threads as the trainer chooses them (cores // ranks): the GPU machine has more cores than 2.
    out = {"2 CPU ranks": run_arm(graph, "graphtrainer.nn", 0, args, threads_per_proc=None),
           "1 GPU rank": run_arm(graph, "torch blocks", 0, args, gpus=1, num_procs=None, block_type="auto",
                                 threads_per_proc=None)}
    for r in out.values():
        r["seeds_per_s"], r["train_nodes"] = n_train / r["epoch_s"], n_train
    return out


def render(cpu: Dict[str, Any], gpu: Dict[str, Any], args: Any, device: str) -> str:
    size, timed = workload.size_label(args.size), args.epochs - 1
    text = f"Device: {device}\n\n" + (
        f"CPU ranks (2 x 1 thread), {size}, seeds {args.seeds}, {timed} timed epochs per run: rank 0's epoch, "
        "median wall (and fastest) and CPU time, as the median over seeds of arm / dgl.nn (target for torch blocks "
        "<= 1.10x); test accuracy from a full-neighbour evaluation\n\n" + harness.markdown_table(
            ["arm", "epoch wall (s)", "wall vs dgl.nn", "fastest epoch vs dgl.nn", "epoch CPU (s)", "CPU vs dgl.nn",
             "test acc per seed", "mean test acc"],
            [[arm, f"{m['epoch_s']:.3f}", harness.fmt_ratio(m["time_ratio"]), harness.fmt_ratio(m["min_time_ratio"]),
              f"{m['epoch_cpu_s']:.3f}", harness.fmt_ratio(m["cpu_ratio"]),
              ", ".join(f"{a:.4f}" for a in m["test_acc"]), f"{m['test_acc_mean']:.4f}"] for arm, m in cpu.items()])
        if cpu else "CPU part: not run (--gpu-only).")
    if not gpu:
        return text + "\n\nGPU part: not run (no CUDA device here)."
    ratio = gpu["1 GPU rank"]["seeds_per_s"] / gpu["2 CPU ranks"]["seeds_per_s"]
    return text + (
        f"\n\nGPU part, {size}, {gpu['1 GPU rank']['train_nodes']:,} training seeds, batch {args.batch_size}, {timed} "
        "timed epochs: 1 GPU rank (torch blocks) vs 2 CPU ranks (DGL blocks; threads as the trainer sets them, the "
        "cores shared among the ranks)\n\n" + harness.markdown_table(
            ["setting", "epoch (s)", "seeds/s", "test acc"],
            [[k, f"{r['epoch_s']:.3f}", f"{r['seeds_per_s']:,.0f}", f"{r['test_acc']:.4f}"] for k, r in gpu.items()])
        + f"\n\nseeds/s ratio, 1 GPU rank / 2 CPU ranks: {ratio:.2f}x")


def main(argv: Any = None) -> Dict[str, Any]:
    import torch

    args = parse_args(argv)
    machine = harness.machine_info()  # the load before the run
    graph = workload.build_graph({"dataset": "synthetic", **args.size, "feat_dim": args.feat_dim})
    n_train = workload.cap_train(graph, args.max_train_nodes)
    cuda = torch.cuda.device_count() > 0  # unlike is_available(), leaves CUDA untouched for the forks
    if args.gpu_only and not cuda:
        raise SystemExit("--gpu-only needs a CUDA device; without one, leave it out to run the CPU part")
    cpu = {} if args.gpu_only else cpu_part(graph, args)  # before anything here touches CUDA: ranks fork
    gpu = gpu_part(graph, args, n_train) if cuda else {}
    device = torch.cuda.get_device_name(0) if cuda else f"CPU only ({machine.get('cpu_model')})"
    bars = ({f"{k}\n{m}": v[f"epoch{m}_s"] for k, v in cpu.items() for m in ("", "_cpu")} if cpu else
            {k: v["seeds_per_s"] for k, v in gpu.items()})
    return harness.report(args, {"device": device, "cuda": cuda, "train_nodes": n_train, "machine": machine,
                                 "cpu": cpu, "gpu": gpu}, render(cpu, gpu, args, device), harness.bar_plot(
        bars, "rank 0 epoch (s): wall, CPU" if cpu else "training seeds/s"), figsize=(7, 4))


if __name__ == "__main__":
    main()
