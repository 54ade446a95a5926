"""Neighbour sampling in torch ops (``sampling="device"``) against DGL's C++ sampler per batch (CPU,
and GPU where there is one), uniform and weighted (``prob=``, ``mask=``), and (``--gpu``) the seeds/s,
step time and peak GPU memory of a GPU rank sampling on the GPU, with DGL on the CPU (0 and
``--workers`` workers), and of 2 CPU ranks.

    python benchmarks/device_sampling.py --out benchmarks/results/device_sampling   # per batch, CPU
    python benchmarks/device_sampling.py --gpu --out DIR    # on a GPU machine: every part
                                           # (the weighted draws on the 50k graph only)"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple
from unittest import mock

import torch

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import workload
import dgl
from graphtrainer.data.device.batches import node_maps
from graphtrainer.data.device.graph import bytes_to_copy, device_graph, drop_copies
from graphtrainer.data.device.mode import BUDGET_ENV
from graphtrainer.data.device.sampler import DeviceSampler
from graphtrainer.testing.op_count import OpCounter

GRAPHS = {  # name: (size, feat_dim, fanouts, batch, hidden, train nodes)
    "50k": ("50kx10", 64, [10, 10], 512, 128, 30_000),
    "products": ("2.4Mx25", 100, [15, 10, 5], 1024, 256, 200_000),
    "tiny": ("3kx5", 16, [5, 5], 128, 16, 600),  # --tiny
}
DEVICE_ARM = "GPU rank, sampling on the GPU"


def sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: The per-batch draws: NeighborSampler's weighing options (edge data from :func:`add_weights`).
DRAWS = {"uniform": {}, "prob": {"prob": "w"}, "mask": {"mask": "m"}}
WEIGHTS = "w: random float32 in [0.1, 1); m: bool, 4 edges in 5 True"


def add_weights(graph: Any) -> None:
    """The weighted arms' edge data: a positive weight ``w`` and a mask ``m`` per edge (:data:`WEIGHTS`)."""
    gen = torch.Generator().manual_seed(0)
    graph.edata["w"] = 0.1 + 0.9 * torch.rand(graph.num_edges(), generator=gen)
    graph.edata["m"] = torch.rand(graph.num_edges(), generator=gen) < 0.8


def per_batch(graph: Any, name: str, device: Any, batches: int, weighted: Sequence[str] = ()) -> Dict:
    """Median ms per batch of DGL's sampler and the torch sampler, uniform and each ``weighted`` draw, all in turn
    batch by batch on the same seeds, the torch ops one batch of the torch sampler dispatches, and
    on a GPU a profile of 3 uniform batches. The uniform draw's figures are the entry's own, the
    others' under ``weighted``, each with its median edges per batch of both samplers, its cost
    against the uniform draw, and (mask) the masked-out edges either sampler drew (must be 0)."""
    _, _, fanouts, batch, *_ = GRAPHS[name]
    draws = ("uniform", *weighted)
    dgls = {d: dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"],
                                               **DRAWS[d]) for d in draws}
    mine = {d: DeviceSampler.from_dgl(s, graph) for d, s in dgls.items()}
    drop_copies(graph)  # not a training arm's (its features may be on the host)
    dg = device_graph(graph, device, mine["uniform"].node_keys(), {})
    for d in weighted:  # the same copy, with each weighted draw's key
        device_graph(graph, device, mine[d].node_keys(), {}, weights=mine[d].prob)
    maps = node_maps(dg)  # built once, as a loader does
    ids = workload.split_ids(graph, "train")
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))]
    rows: Dict[str, List[Tuple[float, float, int, int]]] = {d: [] for d in draws}  # DGL ms, torch ms, edges
    drawn_out = {"dgl": 0, "torch": 0}  # masked-out edges drawn
    for i in range(batches + 2):
        seeds = ids[(i * batch) % max(1, ids.numel() - batch):][:batch]
        for d in draws:
            started = time.perf_counter()
            inputs, _, blocks = dgls[d].sample(graph, seeds)
            graph.ndata["feat"].index_select(0, inputs), graph.ndata["label"][seeds]  # as DGL's loader gathers
            dgl_done = time.perf_counter()  # (the device is idle: the last batch ended synchronised)
            _, mine_blocks = mine[d].sample(dg, maps, {"_N": seeds.to(device)},
                                            torch.Generator(device=device).manual_seed(i))
            sync(device)
            rows[d].append((1e3 * (dgl_done - started), 1e3 * (time.perf_counter() - dgl_done),
                            sum(b.num_edges() for b in blocks), sum(b.num_edges() for b in mine_blocks)))
            if d == "mask":  # (untimed)
                drawn_out["dgl"] += sum(int((~graph.edata["m"][b.edata[dgl.EID]]).sum()) for b in blocks)
                drawn_out["torch"] += sum(int((~graph.edata["m"][b.edata["_ID"].cpu()]).sum()) for b in mine_blocks)
    out: Dict[str, Any] = {}
    for d in draws:
        dgl_ms, torch_ms, edges, torch_edges = zip(*rows[d][2:])  # the first 2 warm up: allocator, kernels
        with OpCounter() as counter:
            mine[d].sample(dg, maps, {"_N": ids[:batch].to(device)}, torch.Generator(device=device).manual_seed(0))
        ms = {"dgl": harness.median(dgl_ms), "torch": harness.median(torch_ms)}
        res = {"ms": ms, "edges_per_batch": harness.median(edges), "torch_edges_per_batch": harness.median(torch_edges),
               "torch_ops": counter.total}
        if d == "uniform":
            res["ms"] = {"dgl": ms["dgl"], "floyd": ms["torch"]}  # (the name earlier results have)
            out.update(res)
        else:
            uniform = out["ms"]
            res["vs_uniform"] = {"dgl": ms["dgl"] / uniform["dgl"], "torch": ms["torch"] / uniform["floyd"]}
            res.update({"masked_out_drawn": drawn_out} if d == "mask" else {})
            out.setdefault("weighted", {})[d] = res
    if device.type == "cuda":  # the kernels' time against the host's, which launches them
        with torch.profiler.profile() as prof:
            for i in range(3):
                mine["uniform"].sample(dg, maps, {"_N": ids[:batch].to(device)}, torch.Generator(device).manual_seed(i))
        out["profile"] = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
    return out


class StepClock(workload.EpochTimer):
    """Rank 0's epoch clock with the GPU synchronised at the end of step ``warm`` and of the epoch (the timed
    steps are those after ``warm``), plus its peak GPU memory and where its loader sampled."""

    FIELDS = (*workload.EpochTimer.FIELDS, "gpu")

    def __init__(self, warm: int) -> None:
        super().__init__()
        self.warm, self.gpu = warm, []

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if len(self.step_ends[-1]) + 1 == self.warm:
            sync(task.device)
        super().on_train_batch_end(trainer, task, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        sync(task.device)
        super().on_train_epoch_end(trainer, task)
        cuda = task.device.type == "cuda"
        self.gpu.append({"peak_bytes": torch.cuda.max_memory_allocated(task.device) if cuda else 0,
                         "mode": task.train_loader.sampling_mode,
                         "host_data": bool(getattr(task.train_loader.device_sampling, "host_note", ""))})
        if cuda:  # the next arm that trains on the GPU in this process: its own peak
            torch.cuda.reset_peak_memory_stats(task.device)


class TrainTask(workload.BenchTask):
    """The benchmark task with ``workers`` sampling workers; keeps its loader for the clock."""

    workers = 0  # set per arm

    def train_dataloader(self) -> Any:
        kwargs = {"num_workers": self.workers} if self.workers else {}
        self.train_loader = self.node_dataloader(self.seeds("train"), self.train_sampler(), self.batch_size, **kwargs)
        return self.train_loader


def train_arm(graph: Any, name: str, steps: int, warm: int, workers: int = 0, host_feats: bool = False,
              **trainer_kwargs: Any) -> Dict:
    _, _, fanouts, batch, hidden, _ = GRAPHS[name]
    task = TrainTask(graph, fanouts=fanouts, hidden=hidden, batch_size=batch, lr=3e-3, dropout=0.5)
    task.workers, clock = workers, StepClock(warm)
    trainer_kwargs.setdefault("num_procs", None)  # a GPU rank: gpus=1 alone
    drop_copies(graph)  # a rank in this process: each arm makes its own copy
    room = bytes_to_copy(graph, torch.device("cpu"), {"_N": ("label",)}, {})  # host_feats: structure and labels only
    with mock.patch.dict("os.environ", {BUDGET_ENV: str(room)} if host_feats else {}):
        workload.fit(graph, task, 1, clock, evaluate_test=False, limit_train_batches=warm + steps, **trainer_kwargs)
    timed, seconds = clock.steps[0] - warm, clock.times[0] - clock.step_ends[0][warm - 1]
    return dict(clock.gpu[0], steps=timed, seconds=seconds, step_ms=1e3 * seconds / timed,
                seeds_per_s=(trainer_kwargs.get("num_procs") or 1) * batch * timed / seconds)


def train_part(graphs: Dict[str, Any], args: Any) -> Dict[str, Any]:
    """Every graph's arms; the 2-CPU-rank arms of all graphs first: a GPU rank trained in this
    process leaves autograd's device threads here, and CPU ranks cannot be forked after that."""
    one = dict(num_procs=1) if args.cpu_arms else dict(gpus=1)
    plan = [("2 CPU ranks (DGL sampling)", dict(num_procs=2, sampling="cpu", launcher="fork")),
            (DEVICE_ARM, dict(one, sampling="device")),
            ("GPU rank, DGL sampling on the CPU", dict(one, sampling="cpu"))]
    plan += [(f"{DEVICE_ARM}, features gathered on the host", dict(one, sampling="device", host_feats=True))]
    plan += [(f"GPU rank, DGL sampling, {w} workers", dict(one, sampling="cpu", workers=w)) for w in args.workers]
    out: Dict[str, Dict[str, Any]] = {name: {} for name in graphs}
    for label, kwargs in plan:
        if args.arms and not any(a in label for a in args.arms):
            continue
        for name, graph in graphs.items():
            cpu_ranks = kwargs.get("num_procs") == 2
            steps = max(3, args.steps // 4) if cpu_ranks else args.steps
            warm = 1 if args.tiny else (2 if cpu_ranks else 5)
            try:
                res = train_arm(graph, name, steps, warm, **kwargs)
            except Exception as err:  # keep the other arms' figures: a device call is short
                res = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
            out[name][label] = res
            print(f"[device_sampling] {name} {label}: "
                  + (f"FAILED {res['error']}" if "error" in res else f"{res['seeds_per_s']:,.0f} seeds/s"), flush=True)
    return out


def render(results: Dict[str, Any], device: str) -> str:
    text = f"Device: {device}\n\nPer batch (median ms; sampling plus gathering features and labels):\n\n"
    text += harness.markdown_table(
        ["graph on device", "edges/batch", "DGL (CPU)", "torch, Floyd", "Floyd / DGL", "torch ops/batch"],
        [[key, f"{r['edges_per_batch']:,.0f}", f"{r['ms']['dgl']:.2f}", f"{r['ms']['floyd']:.2f}",
          harness.fmt_ratio(r["ms"]["floyd"] / r["ms"]["dgl"]), r.get("torch_ops", "")]
         for key, r in results["per_batch"].items()])
    busy = [f"{key} {r['other_cores']:.2f}" + (" (noisy)" if r["other_cores"] > harness.NOISY_CORES else "")
            for key, r in results["per_batch"].items() if "other_cores" in r]
    text += f"\n\nCores busy elsewhere while timed: {'; '.join(busy)}" if busy else ""
    weighted = [(key, d, w) for key, r in results["per_batch"].items() for d, w in r.get("weighted", {}).items()]
    if weighted:
        text += (f"\n\nWeighted and masked draws, in turn with the uniform ones above on the same seeds ({WEIGHTS}; "
                 "edges/batch: DGL's, torch's; x uniform: against the same sampler's uniform draw):\n\n")
        text += harness.markdown_table(
            ["graph on device", "draw", "edges/batch", "DGL (CPU)", "torch", "torch / DGL", "DGL x uniform",
             "torch x uniform", "torch ops/batch", "masked-out edges drawn"],
            [[key, f"{d}={DRAWS[d][d]!r}", f"{w['edges_per_batch']:,.0f}, {w['torch_edges_per_batch']:,.0f}",
              f"{w['ms']['dgl']:.2f}", f"{w['ms']['torch']:.2f}", harness.fmt_ratio(w["ms"]["torch"] / w["ms"]["dgl"]),
              harness.fmt_ratio(w["vs_uniform"]["dgl"]), harness.fmt_ratio(w["vs_uniform"]["torch"]), w["torch_ops"],
              ", ".join(f"{k} {v}" for k, v in w.get("masked_out_drawn", {}).items())]
             for key, d, w in weighted])
    for name, arms in results["training"].items():
        ok = {k: v for k, v in arms.items() if "error" not in v}
        cpu_best = max([v["seeds_per_s"] for v in ok.values() if v["mode"] != "device"] or [float("nan")])
        text += f"\n\nTraining, {name} graph ({GRAPHS[name][0]}): seeds/s\n\n" + harness.markdown_table(
            ["arm", "sampled on", "seeds/s", "step (ms)", "peak GPU memory (GiB)", "vs best CPU-sampling arm"],
            [[k, "CPU" if v["mode"] != "device" else "device, features on host" if v.get("host_data") else "device",
              f"{v['seeds_per_s']:,.0f}", f"{v['step_ms']:.1f}", f"{v['peak_bytes'] / 2**30:.2f}",
              harness.fmt_ratio(v["seeds_per_s"] / cpu_best)]
             if "error" not in v else [k, v["error"], "", "", "", ""] for k, v in arms.items()])
        dev, share = ok.get(DEVICE_ARM), results["per_batch"].get(f"{name} on cuda:0")
        if dev and share:
            text += (f"\n\nSampling share of a device-arm step: {share['ms']['floyd']:.2f} ms of "
                     f"{dev['step_ms']:.2f} ms ({100 * share['ms']['floyd'] / dev['step_ms']:.0f}%)")
    text += "".join(f"\n\nProfile of 3 batches, {k}:\n\n```\n{r['profile']}\n```"
                    for k, r in results["per_batch"].items() if "profile" in r)
    return text if results["training"] else text + "\n\nTraining part: not run (needs --gpu and a CUDA device)."


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("device_sampling", __doc__,
                            tiny={"graphs": ["tiny"], "batches": 3, "steps": 3, "workers": [1]})
    p.add_argument("--graphs", nargs="+", choices=list(GRAPHS), help="default: 50k; with --gpu 50k and products")
    p.add_argument("--batches", type=int, default=20, help="timed batches per sampler (per-batch part)")
    p.add_argument("--gpu", action="store_true", help="also the training part (needs CUDA)")
    p.add_argument("--steps", type=int, default=40, help="timed training steps per GPU-rank arm")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="sampling workers tried (CPU sampling)")
    p.add_argument("--arms", nargs="+", help="only the training arms whose label holds one of these")
    p.add_argument("--no-per-batch", dest="per_batch", action="store_false", help="leave out the per-batch part")
    p.add_argument("--weighted", nargs="*", choices=list(DRAWS)[1:], default=list(DRAWS)[1:],
                   help="the weighted draws timed per batch beside the uniform one (none: --weighted alone)")
    p.add_argument("--weighted-graphs", nargs="*", choices=list(GRAPHS),
                   help="the graphs with the weighted draws (default: every graph; with --gpu all but products, "
                        "to keep gpu_machine.sh's run short)")
    p.add_argument("--cpu-arms", action="store_true", help="train one CPU rank in place of the GPU rank (anywhere)")
    args = p.parse_args(argv)
    args.graphs = args.graphs or (["50k", "products"] if args.gpu else ["50k"])
    if args.weighted_graphs is None:
        args.weighted_graphs = [g for g in args.graphs if not (args.gpu and g == "products")]
    cuda = torch.cuda.device_count() > 0  # unlike is_available(), leaves CUDA untouched for the forks
    if args.gpu and not cuda and not args.cpu_arms:
        raise SystemExit("--gpu needs a CUDA device; without it the script runs the per-batch part on the CPU")
    graphs = {name: workload.build_graph({"dataset": "synthetic", **workload.parse_size(GRAPHS[name][0]),
                                          "feat_dim": GRAPHS[name][1]}) for name in args.graphs}
    for name, graph in graphs.items():
        workload.cap_train(graph, GRAPHS[name][-1])
    results: Dict[str, Any] = {"per_batch": {}, "training": train_part(graphs, args) if args.gpu else {}}
    # (the training part first, before this process touches CUDA: the ranks fork)
    devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if cuda else [])
    for name, graph in graphs.items() if args.per_batch else ():
        weighted = args.weighted if name in args.weighted_graphs else []
        if weighted:
            add_weights(graph)
        for device in (devices[1:] or devices) if name == "products" else devices:  # products: the GPU if any
            with harness.LoadMeter() as load:  # the timings' noise: other work on the machine meanwhile
                entry = results["per_batch"][f"{name} on {device}"] = per_batch(graph, name, device, args.batches,
                                                                                weighted)
            entry["other_cores"] = load.other_cores
    device = torch.cuda.get_device_name(0) if cuda else f"CPU only ({harness.machine_info().get('cpu_model')})"
    draws = [(k, d, ms) for k, r in results["per_batch"].items()  # each entry's uniform draw, then the others
             for d, ms in [("", r["ms"])] + [(d, w["ms"]) for d, w in r.get("weighted", {}).items()]]
    bars = {f"{k}\n{d} {m}".replace("\n ", "\n"): v for k, d, ms in draws for m, v in ms.items()}
    plot = harness.bar_plot(bars, "ms per batch (median)")
    return harness.report(args, {"device": device, **results}, render(results, device), plot,
                          figsize=(max(7, 1.1 * len(bars)), 4))


if __name__ == "__main__":
    main()
