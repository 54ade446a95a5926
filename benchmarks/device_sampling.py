"""Neighbour sampling in torch ops (``sampling="device"``) against DGL's C++ sampler, and what a
GPU rank gains from sampling on the GPU.

    python benchmarks/device_sampling.py --out benchmarks/results/device_sampling   # CPU part
    python benchmarks/device_sampling.py --tiny                                     # seconds
    python benchmarks/device_sampling.py --gpu --out DIR    # on a GPU machine: every part

Per batch (one process, interleaved): sample a batch and gather its features and labels,
DGL's sampler against the torch one, on the CPU and on the GPU. Training (``--gpu``): seeds/s
of a GPU rank with ``sampling="device"``, with ``sampling="cpu"`` (0 and ``--workers``
workers) and of 2 CPU ranks, on a 50k graph and an ogbn-products-sized one.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any, Dict, List

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import workload

GRAPHS = {  # name: (size, feat_dim, fanouts, batch, hidden, train nodes)
    "50k": ("50kx10", 64, [10, 10], 512, 128, 30_000),
    "products": ("2.4Mx25", 100, [15, 10, 5], 1024, 256, 200_000),
}


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("device_sampling", __doc__.split("\n")[0])
    p.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=["50k"],
                   help="graphs of the per-batch part (default: 50k; --gpu adds products)")
    p.add_argument("--batches", type=int, default=20, help="timed batches per sampler (per-batch part)")
    p.add_argument("--gpu", action="store_true", help="also the training part (needs CUDA)")
    p.add_argument("--steps", type=int, default=40, help="timed training steps per GPU-rank arm")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="sampling workers tried (CPU sampling)")
    p.add_argument("--arms", nargs="+", default=None, help="only the training arms whose label holds one of these")
    p.add_argument("--per-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="the per-batch part (default on)")
    p.add_argument("--cpu-arms", action="store_true",
                   help="the training part with one CPU rank in place of the GPU rank (checks the script anywhere)")
    args = p.parse_args(argv)
    if args.tiny:
        GRAPHS["tiny"] = ("3kx5", 16, [5, 5], 128, 16, 600)
        args.graphs, args.batches, args.steps, args.workers = ["tiny"], 3, 3, [1]
    elif args.gpu and "products" not in args.graphs:
        args.graphs.append("products")
    return args


def build(name: str) -> Any:
    size, feat, *_ = GRAPHS[name]
    return workload.build_graph({"dataset": "synthetic", **workload.parse_size(size), "feat_dim": feat})


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_batch(graph: Any, name: str, device: Any, batches: int) -> Dict[str, Any]:
    """Median ms per batch of each sampler, batch by batch in turn on the same seeds."""
    import dgl
    import torch

    from graphtrainer.data.device.batches import node_maps
    from graphtrainer.data.device.graph import device_graph
    from graphtrainer.data.device.sampler import DeviceSampler

    _, _, fanouts, batch, *_ = GRAPHS[name]
    sampler = dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    mine = DeviceSampler.from_dgl(sampler, graph)
    dg = device_graph(graph, device, mine.node_keys(), {})
    maps = node_maps(dg)
    ids = workload.split_ids(graph, "train")
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))]
    times: Dict[str, List[float]] = {"dgl": [], "floyd": []}
    edges = []
    for i in range(batches + 2):
        seeds = ids[(i * batch) % max(1, ids.numel() - batch):][:batch]
        started = time.perf_counter()
        inputs, _, blocks = sampler.sample(graph, seeds)
        graph.ndata["feat"][inputs], graph.ndata["label"][seeds]  # what DGL's loader gathers
        row = {"dgl": time.perf_counter() - started}
        sync(device)
        started = time.perf_counter()
        mine.sample(dg, maps, {"_N": seeds.to(device)}, torch.Generator(device=device).manual_seed(i))
        sync(device)
        row["floyd"] = time.perf_counter() - started
        if i >= 2:  # warm-up: allocator, kernels
            for k, v in row.items():
                times[k].append(v * 1e3)
            edges.append(sum(b.num_edges() for b in blocks))
    out = {k: harness.median(v) for k, v in times.items()}
    return {"ms": out, "edges_per_batch": harness.median(edges), "device": str(device),
            "torch_vs_dgl": out["floyd"] / out["dgl"]}


def _clock_class() -> Any:
    from graphtrainer.callbacks import Callback

    class StepClock(Callback):
        """Rank 0 times ``steps`` training steps after ``warm`` ones and writes them to ``path``."""

        def __init__(self, warm: int, path: str):
            self.warm, self.path, self.n, self.t0 = warm, path, 0, 0.0

        def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.n += 1
            if self.n == self.warm:
                sync(task.device)
                self.t0 = time.perf_counter()

        def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
            import torch

            if task.device.type == "cuda":  # a GPU rank may run in this process: each arm its own peak
                torch.cuda.reset_peak_memory_stats(task.device)

        def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
            import torch

            sync(task.device)
            if trainer.rank == 0:
                peak = torch.cuda.max_memory_allocated(task.device) if task.device.type == "cuda" else 0
                with open(self.path, "w") as fh:
                    json.dump({"steps": self.n - self.warm, "seconds": time.perf_counter() - self.t0,
                               "peak_bytes": peak, "mode": task.trainer_loader_mode}, fh)

    return StepClock


class TrainTask(workload.BenchTask):
    """The benchmark task with sampling workers, and the sampling mode its loader ended up with."""

    workers = 0
    trainer_loader_mode = "?"

    def train_dataloader(self) -> Any:
        kwargs = {"num_workers": self.workers} if self.workers else {}
        self._loader = self.node_dataloader(self.seeds("train"), self.train_sampler(), self.batch_size, **kwargs)
        return self._loader

    def on_train_epoch_start(self) -> None:
        self.trainer_loader_mode = self._loader.sampling_mode


def train_arm(graph: Any, name: str, steps: int, warm: int, workers: int = 0, **trainer_kwargs: Any) -> Dict:
    from graphtrainer import Trainer

    _, _, fanouts, batch, hidden, _ = GRAPHS[name]
    task = TrainTask(graph, fanouts=fanouts, hidden=hidden, batch_size=batch, lr=3e-3, dropout=0.5)
    task.workers = workers
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clock.json")
        Trainer(max_epochs=1, limit_train_batches=warm + steps, progress_bar=False, logger=False,
                enable_model_summary=False, default_root_dir=tmp, callbacks=[_clock_class()(warm, path)],
                **trainer_kwargs).fit(task)
        clock = json.loads(open(path).read())
    ranks = trainer_kwargs.get("num_procs") or 1
    clock["seeds_per_s"] = ranks * batch * clock["steps"] / clock["seconds"]
    clock["step_ms"] = 1e3 * clock["seconds"] / clock["steps"]
    return clock


def train_plan(args: Any) -> List[Any]:
    one = dict(num_procs=1) if args.cpu_arms else dict(gpus=1)
    plan = [("2 CPU ranks (DGL sampling)", dict(num_procs=2, sampling="cpu", launcher="fork")),
            ("GPU rank, sampling on the GPU", dict(one, sampling="device")),
            ("GPU rank, DGL sampling on the CPU", dict(one, sampling="cpu"))]
    plan += [(f"GPU rank, DGL sampling, {w} workers", dict(one, sampling="cpu", workers=w)) for w in args.workers]
    return [(label, kwargs) for label, kwargs in plan if not args.arms or any(a in label for a in args.arms)]


def train_part(graphs: Dict[str, Any], args: Any) -> Dict[str, Any]:
    """Every graph's arms; the 2-CPU-rank arms of all graphs first: a GPU rank trained in this
    process leaves autograd's device threads here, and CPU ranks cannot be forked after that."""
    out: Dict[str, Dict[str, Any]] = {name: {} for name in graphs}
    plan = sorted(train_plan(args), key=lambda arm: arm[1].get("num_procs") != 2)
    for label, kwargs in plan:
        for name, graph in graphs.items():
            cpu_ranks = kwargs.get("num_procs") == 2
            steps = max(3, args.steps // 4) if cpu_ranks else args.steps
            warm = 1 if args.tiny else (2 if cpu_ranks else 5)
            try:
                out[name][label] = train_arm(graph, name, steps, warm, **kwargs)
                print(f"[device_sampling] {name} {label}: {out[name][label]['seeds_per_s']:,.0f} seeds/s", flush=True)
            except Exception as err:  # keep the other arms' figures: a device call is short
                out[name][label] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
                print(f"[device_sampling] {name} {label}: FAILED {out[name][label]['error']}", flush=True)
    return out


def render(results: Dict[str, Any], device: str) -> str:
    text = f"Device: {device}\n\nPer batch (median ms; sampling plus gathering features and labels):\n\n"
    rows = []
    for key, r in results["per_batch"].items():
        rows.append([key, f"{r['edges_per_batch']:,.0f}", f"{r['ms']['dgl']:.2f}", f"{r['ms']['floyd']:.2f}",
                     harness.fmt_ratio(r["torch_vs_dgl"])])
    text += harness.markdown_table(["graph on device", "edges/batch", "DGL (CPU)", "torch, Floyd", "Floyd / DGL"], rows)
    for name, arms in results.get("training", {}).items():
        ok = {k: v for k, v in arms.items() if "error" not in v}
        cpu_best = max([v["seeds_per_s"] for k, v in ok.items() if "CPU" in k or "DGL" in k] or [float("nan")])
        dev = ok.get("GPU rank, sampling on the GPU")
        text += f"\n\nTraining, {name} graph ({GRAPHS[name][0]}): seeds/s\n\n" + harness.markdown_table(
            ["arm", "sampled on", "seeds/s", "step (ms)", "peak GPU memory (GiB)", "vs best CPU-sampling arm"],
            [[k, "device" if v["mode"] == "device" else "CPU", f"{v['seeds_per_s']:,.0f}", f"{v['step_ms']:.1f}",
              f"{v['peak_bytes'] / 2**30:.2f}", harness.fmt_ratio(v["seeds_per_s"] / cpu_best)]
             if "error" not in v else [k, v["error"], "", "", "", ""]
             for k, v in arms.items()])
        share = results["per_batch"].get(f"{name} on cuda:0")
        if dev and share:
            text += (f"\n\nSampling share of a device-arm step: {share['ms']['floyd']:.2f} ms of "
                     f"{dev['step_ms']:.2f} ms ({100 * share['ms']['floyd'] / dev['step_ms']:.0f}%)")
    return text


def main(argv: Any = None) -> Dict[str, Any]:
    import torch

    args = parse_args(argv)
    cuda = torch.cuda.device_count() > 0
    if args.gpu and not cuda and not args.cpu_arms:
        raise SystemExit("--gpu needs a CUDA device; without it the script runs the per-batch part on the CPU")
    started, machine = time.perf_counter(), harness.machine_info()
    results: Dict[str, Any] = {"per_batch": {}, "training": {}}
    graphs = {name: build(name) for name in args.graphs}
    for name, graph in graphs.items():
        workload.cap_train(graph, GRAPHS[name][5])
    if args.gpu:  # before this process touches CUDA: the ranks fork
        results["training"] = train_part(graphs, args)
    devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if cuda else [])
    for name, graph in graphs.items() if args.per_batch else ():
        for device in devices:
            if device.type == "cpu" and name == "products" and not args.tiny:
                continue  # the CPU comparison runs on the 50k graph; the products graph is for the GPU
            results["per_batch"][f"{name} on {device}"] = per_batch(graph, name, device, args.batches)
    device = torch.cuda.get_device_name(0) if cuda else f"CPU only ({machine.get('cpu_model')})"
    markdown = render(results, device)
    if not args.gpu:
        markdown += "\n\nTraining part: not run (needs --gpu and a CUDA device)."
    print(markdown, flush=True)
    payload = {"benchmark": "device_sampling", "device": device, "args": {k: str(v) for k, v in vars(args).items()},
               "machine": machine, "versions": harness.versions(), **results,
               "wall_s": time.perf_counter() - started}
    harness.write_outputs(args.out, "device_sampling", payload, markdown, harness.bar_plot(
        {f"{k}\n{m}": r["ms"][m] for k, r in results["per_batch"].items() for m in r["ms"]}, "ms per batch (median)"),
        figsize=(7, 4))
    return payload


if __name__ == "__main__":
    main()
