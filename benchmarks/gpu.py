"""GNN message passing in plain torch (graphtrainer.nn on torch-only blocks) against dgl.nn on
DGL blocks, and, where CUDA exists, what a GPU rank gives.

    python benchmarks/gpu.py --out benchmarks/results/gpu            # CPU part (+ GPU part on a GPU)
    python benchmarks/gpu.py --tiny                                  # seconds (smoke test)
    python benchmarks/gpu.py --gpu-only --out benchmarks/results/gpu/h100   # on a GPU machine

CPU part, 2 CPU ranks, interleaved per seed: ``dgl.nn``, ``graphtrainer.nn`` on DGL blocks and
on torch-only blocks; ratios against ``dgl.nn``. GPU part: seeds/s of 1 GPU rank against 2 CPU
ranks.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import workload
from workload import EpochTimer, cap_train


class CostTimer(EpochTimer):
    """EpochTimer plus rank 0's CPU seconds per epoch (all its threads): on a machine other
    jobs load, wall time measures the scheduler as much as the code; CPU time does not."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: List[float] = []
        self._c0 = 0.0

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "cpu": list(self.cpu)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.cpu = list(state["cpu"])

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        super().on_train_epoch_start(trainer, task)
        self._c0 = time.process_time()

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        super().on_train_epoch_end(trainer, task)
        self.cpu.append(time.process_time() - self._c0)

ARMS = ("dgl.nn", "graphtrainer.nn", "torch blocks")
BLOCK_TYPE = {"dgl.nn": "dgl", "graphtrainer.nn": "dgl", "torch blocks": "torch"}


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("gpu", __doc__.split("\n")[0])
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("50kx10"))
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--max-train-nodes", type=int, default=8_000)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=5, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--gpu-only", action="store_true",
                   help="skip the CPU part (it measures CPU ranks only; the GPU part has its own CPU baseline)")
    args = p.parse_args(argv)
    if args.tiny:
        args.size, args.max_train_nodes, args.epochs, args.seeds = workload.parse_size("3kx5"), 600, 2, [0]
        args.batch_size, args.hidden = 128, 16
    return args


class DglSAGE:
    """graphtrainer.models.SAGE with dgl.nn's SAGEConv layers, holding the same initial weights
    as graphtrainer's SAGE for one seed (the parameter names are the same)."""

    @staticmethod
    def build(in_feats: int, hidden: int, out: int, num_layers: int, dropout: float) -> Any:
        import dgl.nn
        from torch import nn

        from graphtrainer.models import SAGE

        model = SAGE(in_feats, hidden, out, num_layers=num_layers, dropout=dropout)
        sizes = [in_feats] + [hidden] * (num_layers - 1) + [out]
        layers = nn.ModuleList(dgl.nn.SAGEConv(sizes[i], sizes[i + 1], "mean") for i in range(num_layers))
        layers.load_state_dict(model.layers.state_dict())
        model.layers = layers
        return model


class ArmTask(workload.BenchTask):
    """The benchmark task with the model of one arm, built from the run's seed."""

    def __init__(self, graph: Any, arm: str, seed: int, **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.arm, self.model_seed = arm, seed

    def configure_model(self) -> Any:
        import torch

        torch.manual_seed(self.model_seed)  # the same initial weights in every arm for one seed
        if self.arm == "dgl.nn":
            return DglSAGE.build(self.in_feats, self.hidden, self.num_classes, len(self.fanouts), self.dropout)
        return super().configure_model()


def run_arm(graph: Any, arm: str, seed: int, args: Any, **trainer_kwargs: Any) -> Dict[str, Any]:
    task = ArmTask(graph, arm, seed, fanouts=[10, 10], hidden=args.hidden, batch_size=args.batch_size, lr=3e-3,
                   dropout=0.5)
    # One thread per rank: 2 ranks fill the 2 cores, and DGL's sampling is repeatable with one thread.
    kwargs: Dict[str, Any] = dict(dict(block_type=BLOCK_TYPE[arm], threads_per_proc=1, seed=seed), **trainer_kwargs)
    timer = CostTimer()
    res = workload.fit(graph, task, args.epochs, timer=timer, **kwargs)
    wall, cpu = workload.steady(timer.times), workload.steady(timer.cpu)
    return dict(res, epoch_s=harness.median(wall), epoch_min_s=min(wall), epoch_cpu_s=harness.median(cpu),
                epoch_cpu_times_s=timer.cpu)


def cpu_part(graph: Any, args: Any) -> Dict[str, Any]:
    runs, _ = harness.interleave(  # round k runs seed k, every arm from the same weights
        {arm: (lambda k, arm=arm: run_arm(graph, arm, args.seeds[k], args)) for arm in args.arms}, len(args.seeds),
        "gpu", lambda r: f"epoch {r['epoch_s']:.3f} s wall, {r['epoch_cpu_s']:.3f} s CPU, test_acc {r['test_acc']:.4f}",
        alternate=True)
    out: Dict[str, Any] = {}
    base = args.arms[0]
    for arm in args.arms:
        accs = [r["test_acc"] for r in runs[arm]]
        # Per-seed ratios (same seed, adjacent runs) are less exposed to the machine's load drifting.
        ratios = {key: [r[key] / b[key] for r, b in zip(runs[arm], runs[base])]
                  for key in ("epoch_s", "epoch_min_s", "epoch_cpu_s")}
        out[arm] = {key: harness.median([r[key] for r in runs[arm]])
                    for key in ("epoch_s", "epoch_min_s", "epoch_cpu_s")}
        out[arm].update({"test_acc_mean": sum(accs) / len(accs), "test_acc": accs, "runs": runs[arm],
                         "time_ratio": harness.median(ratios["epoch_s"]), "time_ratios": ratios["epoch_s"],
                         "min_time_ratio": harness.median(ratios["epoch_min_s"]),
                         "cpu_ratio": harness.median(ratios["epoch_cpu_s"]), "cpu_ratios": ratios["epoch_cpu_s"]})
    return out


def gpu_part(graph: Any, args: Any, n_train: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    # The CPU ranks run as a CPU user would (DGL blocks); the GPU rank as "auto" picks (torch blocks).
    # Threads as the trainer chooses them (cores // ranks): the GPU machine has more cores than 2.
    out["2 CPU ranks"] = run_arm(graph, "graphtrainer.nn", 0, args, threads_per_proc=None)
    out["1 GPU rank"] = run_arm(graph, "torch blocks", 0, args, gpus=1, num_procs=None, block_type="auto",
                                threads_per_proc=None)
    for r in (out["1 GPU rank"], out["2 CPU ranks"]):
        r["seeds_per_s"], r["train_nodes"] = n_train / r["epoch_s"], n_train
    return out


def render(cpu: Dict[str, Any], gpu: Dict[str, Any], args: Any, device: str) -> str:
    text = f"Device: {device}\n\n" + (render_cpu(cpu, args) if cpu else "CPU part: not run (--gpu-only).")
    if gpu:
        g1, c2 = gpu["1 GPU rank"], gpu["2 CPU ranks"]
        text += (f"\n\nGPU part, {workload.size_label(args.size)}, {g1['train_nodes']:,} training seeds, batch "
                 f"{args.batch_size}, {args.epochs - 1} timed epochs: 1 GPU rank (torch blocks) vs 2 CPU ranks "
                 "(DGL blocks; threads as the trainer sets them, the cores shared among the ranks)\n\n"
                 + harness.markdown_table(["setting", "epoch (s)", "seeds/s", "test acc"],
                                         [[name, f"{r['epoch_s']:.3f}", f"{r['seeds_per_s']:,.0f}",
                                           f"{r['test_acc']:.4f}"] for name, r in (("1 GPU rank", g1),
                                                                                  ("2 CPU ranks", c2))])
                 + f"\n\nseeds/s ratio, 1 GPU rank / 2 CPU ranks: {g1['seeds_per_s'] / c2['seeds_per_s']:.2f}x")
    else:
        text += "\n\nGPU part: not run (no CUDA device here)."
    return text


def render_cpu(cpu: Dict[str, Any], args: Any) -> str:
    rows = [[arm, f"{m['epoch_s']:.3f}", harness.fmt_ratio(m["time_ratio"]), harness.fmt_ratio(m["min_time_ratio"]),
             f"{m['epoch_cpu_s']:.3f}", harness.fmt_ratio(m["cpu_ratio"]),
             ", ".join(f"{a:.4f}" for a in m["test_acc"]), f"{m['test_acc_mean']:.4f}"] for arm, m in cpu.items()]
    return (f"CPU ranks (2 x 1 thread), {workload.size_label(args.size)}, seeds {args.seeds}, "
            f"{args.epochs - 1} timed epochs per run: rank 0's training epoch, wall time (median; and the fastest "
            "epoch) and CPU time (median), each as the median over seeds of arm / dgl.nn (target for torch "
            "blocks <= 1.10x); test accuracy from a full-neighbour evaluation\n\n"
            + harness.markdown_table(["arm", "epoch wall (s)", "wall vs dgl.nn", "fastest epoch vs dgl.nn",
                                     "epoch CPU (s)", "CPU vs dgl.nn", "test acc per seed", "mean test acc"], rows))


def main(argv: Any = None) -> Dict[str, Any]:
    import torch

    args = parse_args(argv)
    started, machine = time.perf_counter(), harness.machine_info()
    graph = workload.build_graph({"dataset": "synthetic", **args.size, "feat_dim": args.feat_dim})
    n_train = cap_train(graph, args.max_train_nodes)
    cuda = torch.cuda.device_count() > 0  # unlike is_available(), leaves CUDA untouched for the forks
    if args.gpu_only and not cuda:
        raise SystemExit("--gpu-only needs a CUDA device; without one, leave it out to run the CPU part")
    cpu = {} if args.gpu_only else cpu_part(graph, args)  # before anything here touches CUDA: ranks fork
    gpu = gpu_part(graph, args, n_train) if cuda else {}
    device = torch.cuda.get_device_name(0) if cuda else f"CPU only ({machine.get('cpu_model')})"
    markdown = render(cpu, gpu, args, device)
    print(markdown, flush=True)

    payload = {"benchmark": "gpu", "device": device, "cuda": cuda, "train_nodes": n_train,
               "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine,
               "versions": harness.versions(), "cpu": cpu, "gpu": gpu, "wall_s": time.perf_counter() - started}
    bars = ({f"{k}\n{m}": v[f"epoch{m}_s"] for k, v in cpu.items() for m in ("", "_cpu")} if cpu else
            {k: gpu[k]["seeds_per_s"] for k in ("1 GPU rank", "2 CPU ranks")})
    harness.write_outputs(args.out, "gpu", payload, markdown, harness.bar_plot(
        bars, "rank 0 epoch (s): wall, CPU" if cpu else "training seeds/s"), figsize=(7, 4))
    return payload


if __name__ == "__main__":
    main()
