"""What the benchmarks train: graph sizes (``NODESxDEGREE``), the training options, the graphs, the
example's task (train only), one 2-rank fit with rank 0's epoch timer, the arms' summary, and the
hand-written DDP training graphtrainer is compared with, launched as the classic tutorials do."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
from graphtrainer import Trainer, datasets  # before dgl: the newest stack's compatibility layer
import dgl
import torch
import torch.nn.functional as F
from graphtrainer.callbacks import Callback
from graphtrainer.evaluation.ranking import roc_auc
from graphtrainer.examples.node_classification import NodeClassification, standardize_features
from probe import Probe

DATASETS = ("synthetic", "tolokers")


def parse_size(text: str) -> Dict[str, int]:
    """``NODESxDEGREE`` with k/M suffixes, e.g. ``2Mx10`` (2,000,000 nodes, ~20M edges)."""
    def num(s: str) -> int:
        mult = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(s.strip()[-1:], 1)
        return int(float(s.strip()[:-1] if mult > 1 else s) * mult)

    try:
        nodes, _, deg = text.partition("x")
        out = {"num_nodes": num(nodes), "avg_degree": int(deg) if deg else 10}
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use NODESxDEGREE, e.g. 2Mx10") from None
    if out["num_nodes"] < 100 or out["avg_degree"] < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: need at least 100 nodes and degree 1")
    return out


def size_label(size: Dict[str, int]) -> str:
    n = size["num_nodes"]
    return (f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k") + f"x{size['avg_degree']}"


#: The ``--tiny`` values of :func:`training_options`: a seconds-long run.
TINY = {"size": parse_size("20kx5"), "datasets": ["synthetic"], "feat_dim": 16, "hidden": 32, "batch_size": 256,
        "max_train_nodes": 2048, "epochs": 2, "rounds": 1}


def training_options(p: argparse.ArgumentParser, size: str = "1Mx10", feat_dim: int = 64, fanouts: str = "10,10",
                     hidden: int = 128, batch_size: int = 512, max_train_nodes: int = 60_000, epochs: int = 4,
                     datasets: Any = None) -> argparse.ArgumentParser:
    """The options of a training benchmark, with its defaults (``datasets``: offer ``--datasets``)."""
    if datasets is not None:
        p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(datasets))
    p.add_argument("--size", type=parse_size, default=parse_size(size), help=f"NODESxDEGREE (default {size})")
    p.add_argument("--feat-dim", type=int, default=feat_dim)
    p.add_argument("--fanouts", default=fanouts)
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--batch-size", type=int, default=batch_size, help="synthetic graphs (Tolokers: at most 256)")
    p.add_argument("--max-train-nodes", type=int, default=max_train_nodes,
                   help="cap the training seeds (same ids in every arm; default %(default)s)")
    p.add_argument("--epochs", type=int, default=epochs, help="per run; the first is warm-up (default %(default)s)")
    return p


def task_kwargs(args: Any, batch_size: Any = None) -> Dict[str, Any]:
    """``BenchTask`` keyword arguments from :func:`training_options`' values."""
    return {"fanouts": [int(f) for f in str(args.fanouts).split(",")], "hidden": args.hidden, "lr": 3e-3,
            "batch_size": batch_size or args.batch_size, "dropout": 0.5}


def prepared_graphs(args: Any) -> Any:
    """``(spec, graph, train seeds)`` per dataset of ``args``, one graph alive at a time, its
    training seeds capped and its sparse formats built (every arm samples the same structure)."""
    for spec in graph_specs(getattr(args, "datasets", ["synthetic"]), [args.size], args.feat_dim, args.batch_size):
        graph = build_graph(spec)
        n_train = cap_train(graph, args.max_train_nodes)
        graph.create_formats_()
        yield spec, graph, n_train
        del graph


def summarise(runs: Dict[str, List[Dict[str, Any]]], baseline: str, metric: Any = None) -> Dict[str, Any]:
    """Arms' median epoch (warm-up dropped), ratio to ``baseline``, per-round ratios (neighbours in
    the interleaving), mean test ``metric`` (default ``test_auc`` where present, else ``test_acc``)."""
    first = runs[baseline][0]
    metric = metric or ("test_auc" if "test_auc" in first else "test_acc" if "test_acc" in first else None)
    med = {k: harness.median([t for r in v for t in steady(r["epoch_times_s"])]) for k, v in runs.items()}
    per_run = {k: [harness.median(steady(r["epoch_times_s"])) for r in v] for k, v in runs.items()}
    out = {"median_epoch_s": med, "ratios": {k: v / med[baseline] for k, v in med.items()},
           "pair_ratios": {k: [a / b for a, b in zip(v, per_run[baseline])] for k, v in per_run.items()},
           "other_cores": statistics.fmean(r.get("other_cores", 0.0) for v in runs.values() for r in v)}
    if metric:
        out["metric"], out["scores"] = metric, {k: [r[metric] for r in v if metric in r] for k, v in runs.items()}
        out["mean_score"] = {k: statistics.fmean(v) if v else float("nan") for k, v in out["scores"].items()}
    return out


def arms_table(summary: Dict[str, Any], labels: Any = None, baseline_label: str = "") -> str:
    """One row per arm of :func:`summarise`: median epoch, ratio, per-round ratios, test metric."""
    labels = labels or {}
    metric = summary.get("metric", "")
    return harness.markdown_table(
        ["arm", "median epoch (s)", f"vs {baseline_label or 'first arm'}", "each round", metric.replace("_", " ")],
        [[labels.get(k, k), f"{v:.3f}", f"{summary['ratios'][k]:.3f}x",
          " / ".join(f"{x:.3f}" for x in summary["pair_ratios"][k]),
          " / ".join(f"{x:.4f}" for x in summary.get("scores", {}).get(k, []))]
         for k, v in summary["median_epoch_s"].items()])


def graph_specs(datasets: List[str], sizes: List[Dict[str, int]], feat_dim: int, batch_size: int = 1024
                ) -> List[Dict[str, Any]]:
    """One spec per synthetic size and for Tolokers (batch at most 256), for :func:`build_graph`."""
    specs = [{"dataset": "synthetic", "label": size_label(s), **s, "seed": 0, "feat_dim": feat_dim, "num_classes": 8,
              "num_edges": s["num_nodes"] * s["avg_degree"], "batch_size": batch_size}
             for s in sizes if "synthetic" in datasets]
    if "tolokers" in datasets:
        specs.append({"dataset": "tolokers", "label": "tolokers", "num_nodes": 11_758, "num_edges": 1_038_000,
                      "feat_dim": 10, "batch_size": min(batch_size, 256)})
    return specs


def build_graph(spec: Dict[str, Any]) -> Any:
    """``{"dataset": "tolokers"}`` (features standardized as the example does, split 0 of 10 as 1-D masks) or
    ``{"dataset": "synthetic", num_nodes, avg_degree, feat_dim, num_classes, seed}``."""
    if spec["dataset"] == "synthetic":
        return datasets.synthetic(spec["num_nodes"], spec["avg_degree"], spec["feat_dim"],
                                  spec.get("num_classes", 8), spec.get("seed", 0))
    if spec["dataset"] != "tolokers":
        raise ValueError(f"unknown dataset {spec['dataset']!r}: choose one of {DATASETS}")
    graph = datasets.load("tolokers")
    standardize_features(graph)
    return graph


def split_ids(graph: Any, split: str) -> Any:
    return graph.ndata[f"{split}_mask"].nonzero(as_tuple=True)[0]


def cap_train(graph: Any, cap: int, seed: int = 0) -> int:
    """Keep a seeded random ``cap`` of the training nodes (the train mask is rewritten)."""
    ids = split_ids(graph, "train")
    if ids.numel() > cap:
        keep = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))[:cap]]
        graph.ndata["train_mask"] = torch.zeros(graph.num_nodes(), dtype=torch.bool).index_fill_(0, keep, True)
    return int(split_ids(graph, "train").numel())


class BenchTask(NodeClassification):
    """The example's GraphSAGE task without validation (benchmarks time training only), its
    step reduced to what a hand-written loop's does: forward, cross-entropy, the loss logged once."""

    def val_dataloader(self) -> Any:
        return None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)
        return loss


def evaluate(model: Any, graph: Any, ids: Any, batch_size: int = 4096) -> Dict[str, float]:
    """Test metrics over ``ids`` with every neighbour, in this process: ``test_acc``, and
    ``test_auc`` (ROC-AUC of class 1) for binary labels."""
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers), prefetch_node_feats=["feat"],
                                                            prefetch_labels=["label"])
    model.eval()
    with torch.no_grad():
        pairs = [(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]) for _, _, blocks in
                 dgl.dataloading.DataLoader(graph, ids, sampler, batch_size=batch_size, shuffle=False)]
    model.train()
    out, y = torch.cat([o for o, _ in pairs]), torch.cat([t for _, t in pairs])
    metrics = {"test_acc": float((out.argmax(1) == y).float().mean())}
    if out.shape[1] == 2:
        metrics["test_auc"] = roc_auc(torch.softmax(out, 1)[:, 1], y)
    return metrics


def fit(graph: Any, task: Any, epochs: int, timer: Any = None, evaluate_test: bool = True,
        **trainer_kwargs: Any) -> Dict[str, Any]:
    """One ``Trainer(num_procs=2, seed=0, ...)`` fit of ``task`` (keyword arguments override; ``None`` drops one):
    rank 0's epoch times and step ends, the run's wall time and rank 0's test metrics (:func:`evaluate`)."""
    timer = timer or EpochTimer()
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = dict(dict(num_procs=2, seed=0, enable_model_summary=False, default_root_dir=tmp), **trainer_kwargs)
        trainer = Trainer(max_epochs=epochs, progress_bar=False, logger=False, callbacks=[timer],
                          **{k: v for k, v in kwargs.items() if v is not None})
        started = time.perf_counter()
        trainer.fit(task)
        wall = time.perf_counter() - started
    out = {"epoch_times_s": timer.times, "epoch_cpu_times_s": timer.cpu, "steps_per_epoch": timer.steps,
           "step_ends_s": timer.step_ends, "run_wall_s": wall, "threads": trainer.threads_per_proc}
    if evaluate_test:
        out.update(evaluate(task.module.to("cpu"), graph, split_ids(graph, "test")))
    return out


def steady(times: List[float]) -> List[float]:
    """Epoch times without the first (warm-up) one, when there are more."""
    return times[1:] if len(times) > 1 else times


class EpochTimer(Callback):
    """Rank 0's training-loop time per epoch, its CPU seconds (all threads: on a loaded machine wall time measures
    the scheduler too) and each step's end (seconds from the epoch's start); back to the caller as callback state."""

    logs_metrics = False  # its on_train_epoch_end only reads the clock: no second reduction
    FIELDS = ("times", "cpu", "steps", "step_ends")

    def __init__(self) -> None:
        self.times, self.cpu, self.steps = [], [], []  # type: List[float], List[float], List[int]
        self.step_ends: List[List[float]] = []
        self._t0 = self._c0 = 0.0

    def state_dict(self) -> Dict[str, Any]:
        return {k: list(getattr(self, k)) for k in self.FIELDS}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for k in self.FIELDS:
            setattr(self, k, list(state[k]))

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        self.step_ends.append([])

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_ends[-1].append(time.perf_counter() - self._t0)

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)
        self.steps.append(len(self.step_ends[-1]))


# ---- the hand-written DDP loop (DGL's classic multi-GPU tutorial) and its naive spawn launch ----
def handwritten_rank(rank: int, world: int, port: int, conn: Any, cfg: Dict[str, Any]) -> None:
    """One rank on its graph unpickled from ``conn``: DDP, ``DataLoader(use_ddp=True)``, ``loss.item()`` per step.
    ``cfg``: ``workload.task_kwargs``, epochs, threads, seed; optional probe_dir, pause_at, measure_steps (a
    :class:`Probe`), max_steps, evaluate (test metrics), join (epochs in ``Join``); out_file: rank 0's record."""
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    from graphtrainer.models import SAGE

    torch.set_num_threads(cfg["threads"])
    dgl.utils.set_num_threads(cfg["threads"])
    g = pickle.loads(conn.recv_bytes())
    conn.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    torch.manual_seed(cfg["seed"])
    model = DistributedDataParallel(SAGE(g.ndata["feat"].shape[1], cfg["hidden"], int(g.ndata["label"].max()) + 1,
                                         num_layers=len(cfg["fanouts"]), dropout=cfg["dropout"]))
    sampler = dgl.dataloading.NeighborSampler(list(cfg["fanouts"]), prefetch_node_feats=["feat"],
                                              prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, split_ids(g, "train"), sampler, batch_size=cfg["batch_size"], shuffle=True,
                                        drop_last=False, num_workers=0, use_ddp=True)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    probe = Probe(cfg["probe_dir"], cfg["pause_at"], cfg["measure_steps"]) if cfg.get("probe_dir") else None
    if probe is not None:
        probe.fit_start(rank)
    max_steps = cfg.get("max_steps") or float("inf")
    epoch_times: List[float] = []
    step_ends: List[List[float]] = []  # per epoch: seconds from its start to each step's end
    step = 0
    while len(epoch_times) < cfg["epochs"] and step < max_steps:
        model.train()
        t0 = time.perf_counter()
        step_ends.append([])
        with (Join([model]) if cfg.get("join") else contextlib.nullcontext()):
            for _, output_nodes, blocks in loader:
                loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()  # the tutorials' per-step read of the loss
                step += 1
                step_ends[-1].append(time.perf_counter() - t0)
                if probe is not None:
                    probe.step_end(rank, output_nodes.shape[0])
                if step >= max_steps:
                    break
        epoch_times.append(time.perf_counter() - t0)
    if rank == 0:
        metrics = evaluate(model.module, g, split_ids(g, "test")) if cfg.get("evaluate") else {}
        with open(cfg["out_file"], "w", encoding="utf-8") as fh:
            json.dump({"epoch_times_s": epoch_times, "step_ends_s": step_ends, **metrics}, fh)
    dist.barrier()
    if not cfg.get("join"):  # torch 2.2 + gloo: freeing the reducer after Join's un-awaited all-reduces deadlocks
        dist.destroy_process_group()
    # No interpreter finalization: torch 2.15 can abort on a gloo thread still holding a tensor (pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _naive_child(rank: int, world: int, port: int, conn: Any, cfg: Dict[str, Any]) -> None:
    from graphtrainer.process.parent import die_with_parent

    die_with_parent()  # not what tutorials do: it keeps a killed benchmark from leaving ranks behind
    if cfg.get("fresh_thread"):  # overhead.py --thread-arm: train in a new thread, as graphtrainer's ranks do
        worker = threading.Thread(target=handwritten_rank, args=(rank, world, port, conn, cfg), name="train")
        worker.start()
        worker.join()
        sys.exit(1)  # handwritten_rank ends the process when done: its thread returned on an error (printed)
    handwritten_rank(rank, world, port, conn, cfg)


def naive_spawn(graph: Any, world: int, cfg: Dict[str, Any], teardown_timeout_s: float = 60.0) -> Dict[str, Any]:
    """Run ``handwritten_rank`` on ``world`` ranks as the classic tutorials do: spawn, the graph pickled (as
    ``mp.spawn`` does) and piped to every child (this process keeps no bytes), each unpickling its copy (``cfg
    ["fresh_thread"]``: in a new thread); returns rank 0's epoch times, step ends and (``evaluate``) test metrics."""
    import multiprocessing as mp

    from graphtrainer.launch.environment import free_port

    ctx = mp.get_context("spawn")
    data = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gt-bench-naive-") as tmp:
        cfg = dict(cfg, out_file=os.path.join(tmp, "rank0.json"))
        procs, pipes = [], []
        try:
            for rank in range(world):
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_naive_child, args=(rank, world, port, recv, cfg), name=f"naive-rank{rank}")
                proc.start()
                procs.append(proc)
                recv.close()
                pipes.append(send)
            for send in pipes:
                send.send_bytes(data)
                send.close()
            del data
            # No watchdog in the ranks, as in the tutorials; here one failed rank ends the others, and
            # ranks still tearing down long after another finished (all passed the final barrier) are ended.
            first_done = None
            while any(p.exitcode is None for p in procs) and all(p.exitcode in (None, 0) for p in procs):
                if first_done is None and any(p.exitcode == 0 for p in procs):
                    first_done = time.monotonic()
                if first_done is not None and time.monotonic() - first_done > teardown_timeout_s:
                    print(f"[bench] naive spawn: ending the rank(s) still tearing down {teardown_timeout_s:.0f} s "
                          "after another finished", file=sys.stderr, flush=True)
                    break
                next(p for p in procs if p.exitcode is None).join(0.2)
        finally:
            ended = [rank for rank, proc in enumerate(procs) if proc.exitcode is None]
            for rank in ended:
                procs[rank].kill()
                procs[rank].join(5)
        failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0 and r not in ended}
        if failed:
            raise RuntimeError(f"naive spawn ranks failed (rank: exit code) {failed}"
                               + (f"; rank(s) {ended} were then ended by the benchmark" if ended else ""))
        with open(cfg["out_file"], encoding="utf-8") as fh:
            return json.load(fh)
