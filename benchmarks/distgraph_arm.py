"""``distgraph.py``'s arms, each a fresh process: the fit (DistDGL or fork), a probe in its
ranks (epoch times, memory, per-batch costs), a watcher sampling driver and server memory.

    python benchmarks/distgraph_arm.py --arm-worker CONFIG.json    # started by distgraph.py
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence


def mem_watch(pid: int, out_path: str, stop_path: str, interval: float) -> None:
    """Sample PSS/USS/RSS of process ``pid`` and its descendants (not this one) until
    ``stop_path`` exists or ``pid`` is gone; one JSON line per sample."""
    import psutil

    from memory import smaps_rollup

    root = psutil.Process(pid)
    me = os.getpid()
    with open(out_path, "w", encoding="utf-8") as out:
        while not os.path.exists(stop_path) and root.is_running():
            t = time.time()
            procs = []
            try:
                family = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in family:
                if p.pid == me:
                    continue
                try:
                    cmd = " ".join(p.cmdline())
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    role = ("driver" if p.pid == pid else "server" if "graphtrainer.distdgl.servers" in cmd
                            else "rank" if p.ppid() == pid else "other")
                    cpu = p.cpu_times()
                    procs.append({"pid": p.pid, "role": role, "cpu_s": cpu.user + cpu.system, **smaps_rollup(p.pid)})
                except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
            out.write(json.dumps({"t": t, "procs": procs}) + "\n")
            out.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


if __name__ == "__main__" and sys.argv[1:2] == ["--mem-watch"]:
    # The watcher starts before torch and DGL are imported (seconds): it needs neither.
    mem_watch(int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]))
    raise SystemExit(0)

import harness  # noqa: E402  (graphtrainer from this checkout, DGL on PyTorch)
import workload
from graphtrainer.callbacks import Callback  # noqa: E402

SCRIPT = os.path.abspath(__file__)
ARMS = {"distdgl": "DistDGL, 1 partition (2 trainers + 1 graph server)", "fork": "in-memory graph, fork (2 trainers)"}
MB = 1024 * 1024
GB = 1e9


def child_env() -> Dict[str, str]:
    """The environment of the worker processes: graphtrainer from this checkout, unbuffered."""
    path = os.pathsep.join(p for p in (str(harness.ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", DGLBACKEND="pytorch")

class RankProbe(Callback):
    """Per epoch: rank 0's wall time, seeds and batches of all ranks, every rank's USS/PSS/RSS;
    after the last epoch, every rank's per-batch sampling / feature / label costs.
    Travels back to the driver as callback state (rank 0's)."""

    def __init__(self, epochs: int, probe_batches: int, fanouts: Sequence[int], batch_size: int) -> None:
        self.epochs, self.probe_batches = epochs, probe_batches
        self.fanouts, self.batch_size = list(fanouts), batch_size
        self.rows: List[Dict[str, Any]] = []
        self.probe: List[Dict[str, Any]] = []
        self._t0, self._seeds, self._batches = 0.0, 0, 0

    def state_dict(self) -> Dict[str, Any]:
        return {"rows": list(self.rows), "probe": list(self.probe)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.rows, self.probe = list(state["rows"]), list(state["probe"])

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self._seeds = self._batches = 0
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._seeds += int(batch[1].numel())
        self._batches += 1

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        import psutil
        import torch

        from graphtrainer import comm as gdist

        totals = gdist.all_reduce(torch.tensor([float(self._seeds), float(self._batches)], dtype=torch.float64))
        seconds = time.perf_counter() - self._t0  # after the all-reduce: the slower rank's end
        end_wall = time.time()
        mem = psutil.Process().memory_full_info()
        mine = {"rank": task.rank, "seeds": self._seeds, "batches": self._batches, "uss_mb": mem.uss / MB,
                "pss_mb": mem.pss / MB, "rss_mb": mem.rss / MB}
        self.rows.append({"epoch": len(self.rows), "seconds": seconds, "end_wall": end_wall,
                          "seeds_all_ranks": int(totals[0]), "batches_all_ranks": int(totals[1]),
                          "ranks": gdist.all_gather_object(mine)})
        if len(self.rows) == self.epochs and self.probe_batches > 0:
            self.probe = gdist.all_gather_object(batch_costs(task, self.fanouts, self.batch_size,
                                                             self.probe_batches))


def train_pool(task: Any) -> Any:
    """This rank's candidate training seeds: the train ids (in-memory graph), or the train
    nodes of this machine's partition (DistGraph)."""
    from graphtrainer.distdgl.graph import is_dist_graph

    g = task.graph
    if is_dist_graph(g):
        book = g.get_partition_book()
        local = book.partid2nids(book.partid)
        return local[g.ndata["train_mask"][local].bool()]
    return task.split_ids["train"]


def batch_costs(task: Any, fanouts: Sequence[int], batch_size: int, batches: int) -> Dict[str, Any]:
    """Median ms per batch of sampling, feature fetch and label fetch for ``batches``
    batches of random training seeds of this rank (after one warm-up batch)."""
    import dgl
    import torch

    from graphtrainer.distdgl.graph import is_dist_graph

    g = task.graph
    pool = train_pool(task)
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    gen = torch.Generator().manual_seed(1000 + int(task.rank))
    dist = is_dist_graph(g)
    model = copy.deepcopy(task.module)
    cost: Dict[str, List[float]] = {"sample_ms": [], "feat_ms": [], "label_ms": [], "fwd_bwd_ms": []}
    inputs: List[int] = []
    row_bytes = 0
    for i in range(batches + 1):
        seeds = pool[torch.randperm(len(pool), generator=gen)[:batch_size]]
        t0 = time.perf_counter()
        input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
        t1 = time.perf_counter()
        # As each loader gathers them: DistNodeLoader pulls from the DistTensor (kvstore);
        # DGL's DataLoader gathers rows of the in-memory tensor with index_select
        # (dgl.storages.TensorStorage.fetch), not with advanced indexing (8x slower here).
        x = g.ndata["feat"][input_nodes] if dist else torch.index_select(g.ndata["feat"], 0, input_nodes)
        t2 = time.perf_counter()
        if dist:
            y = g.ndata["label"][output_nodes]
        else:
            y = torch.index_select(g.ndata["label"], 0, output_nodes)
        t3 = time.perf_counter()
        # Forward and backward of a copy of the model (no DDP hooks, no optimizer) on these blocks.
        logits = model(blocks, x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        model.zero_grad(set_to_none=True)
        t5 = time.perf_counter()
        if i == 0:
            continue
        row_bytes = x.element_size() * (x.numel() // max(1, x.shape[0]))
        cost["sample_ms"].append(1000 * (t1 - t0))
        cost["feat_ms"].append(1000 * (t2 - t1))
        cost["label_ms"].append(1000 * (t3 - t2))
        cost["fwd_bwd_ms"].append(1000 * (t5 - t3))
        inputs.append(int(input_nodes.numel()))
    # The task's own training loader (NodeLoader or DistNodeLoader), as the epochs used it:
    # a whole batch (seeds, sampling, features, labels) per next().
    from graphtrainer.loop.batches import set_epoch

    loader = task.train_dataloader()
    set_epoch(loader, 1000)
    batches_iter = iter(loader)
    next(batches_iter)  # the loader's start-up
    cost["loader_ms"] = []
    for _ in range(batches):
        t0 = time.perf_counter()
        try:
            next(batches_iter)
        except StopIteration:
            break
        cost["loader_ms"].append(1000 * (time.perf_counter() - t0))
    del batches_iter, loader
    out: Dict[str, Any] = {k: statistics.median(v) for k, v in cost.items() if v}
    out["input_nodes"] = statistics.median(inputs)
    out["feat_mb_per_s"] = out["input_nodes"] * row_bytes / MB / (out["feat_ms"] / 1000) if out["feat_ms"] else None
    out["rank"] = int(task.rank)
    return out


def private_shm_prefix() -> List[str]:
    """A command prefix giving the process a private ``/dev/shm`` (root only), else []."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]


def run_arm(arm: str, cfg: Dict[str, Any], work: Path, private_shm: bool, timeout: float) -> Dict[str, Any]:
    """Run one arm in a fresh worker process; its result dict."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=work))
    cfg = dict(cfg, arm=arm, result=str(run_dir / "result.json"), work=str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(cfg))
    argv = [sys.executable, SCRIPT, "--arm-worker", str(run_dir / "config.json")]
    if private_shm:
        argv = private_shm_prefix() + argv
    log = run_dir / "log.txt"
    load = round(os.getloadavg()[0], 2)
    env = child_env()
    with open(log, "wb") as fh, harness.LoadMeter() as meter:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{arm} run {'timed out' if code is None else f'exited with {code}'}:\n{tail}")
    res = json.loads((run_dir / "result.json").read_text())
    res["loadavg_1min_before"] = load
    res["other_cores"] = meter.other_cores
    if not os.environ.get("DISTGRAPH_KEEP"):
        shutil.rmtree(run_dir, ignore_errors=True)
    return res


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            return


def arm_worker(cfg_path: str) -> None:
    """One arm: build the task, start the memory watcher, fit, write the result JSON."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    work = Path(cfg["work"])
    samples, stop = work / "samples.jsonl", work / "stop"
    watcher = subprocess.Popen([sys.executable, SCRIPT, "--mem-watch", str(os.getpid()), str(samples), str(stop),
                                str(cfg["watch_interval_s"])], env=child_env())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (samples.exists() and samples.stat().st_size):
        time.sleep(0.05)  # a first sample (the driver alone) before anything starts
    t_start = time.time()
    try:
        if cfg["arm"] == "fork":
            graph: Any = workload.build_graph(cfg["spec"])
        else:
            graph = cfg["part_config"]  # the task holds a PartitionedGraph; ranks open the DistGraph
        task = workload.BenchTask(graph, fanouts=cfg["fanouts"], hidden=cfg["hidden"], batch_size=cfg["batch_size"],
                                  lr=3e-3, dropout=0.5)
        probe = RankProbe(cfg["epochs"], cfg["probe_batches"], cfg["fanouts"], cfg["batch_size"])
        kwargs = {"distributed_graph": cfg["part_config"]} if cfg["arm"] == "distdgl" else {}
        trainer = Trainer(num_procs=2, max_epochs=cfg["epochs"], limit_train_batches=cfg["batches"],
                          progress_bar=False, logger=False, enable_model_summary=False, callbacks=[probe], seed=0,
                          default_root_dir=str(work / "runs"), **kwargs)
        t_fit = time.time()
        trainer.fit(task)
        fit_s = time.time() - t_fit
    finally:
        stop.touch()
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    result = {"arm": cfg["arm"], "epochs": probe.rows, "probe": probe.probe, "fit_s": fit_s,
              "start_to_fit_s": t_fit - t_start, "samples": rows, "threads_per_proc": trainer.threads_per_proc}
    Path(cfg["result"]).write_text(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--arm-worker"]:
    arm_worker(sys.argv[2])
