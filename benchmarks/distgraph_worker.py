"""``distgraph.py``'s processes: one arm's fit (DistDGL or fork) with a watcher sampling the
memory of its driver, graph server and trainers; one simulated machine of the remote-fetch part.

    python benchmarks/distgraph_worker.py --arm-worker CONFIG.json   # started by distgraph.py
    python benchmarks/distgraph_worker.py --machine CONFIG.json      # one simulated machine
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

SCRIPT = os.path.abspath(__file__)
MB = 1024 * 1024


def mem_watch(pid: int, out_path: str, stop_path: str, interval: float) -> None:
    """One JSON line per sample of PSS/USS/RSS of ``pid`` and its descendants (not this one),
    each with its role, until ``stop_path`` exists or ``pid`` is gone."""
    import psutil

    root, me = psutil.Process(pid), os.getpid()
    with open(out_path, "w", encoding="utf-8") as out:
        while not os.path.exists(stop_path) and root.is_running():
            t, procs = time.time(), []
            try:
                family = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in family:
                try:
                    if p.pid == me or p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    cmd = " ".join(p.cmdline())
                    role = ("driver" if p.pid == pid else "server" if "graphtrainer.distdgl.servers" in cmd
                            else "rank" if p.ppid() == pid else "other")
                    m = p.memory_full_info()
                    procs.append({"role": role, "pss_mb": m.pss / MB, "uss_mb": m.uss / MB, "rss_mb": m.rss / MB})
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
import workload  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402

ARMS = {"distdgl": "DistDGL, 1 partition (2 trainers + 1 graph server)", "fork": "in-memory graph, fork (2 trainers)"}


def child_env() -> Dict[str, str]:
    path = os.pathsep.join(p for p in (str(harness.ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", DGLBACKEND="pytorch")


class RankProbe(Callback):
    """Per epoch: rank 0's wall time (after an all-reduce of seeds and batches, so the slower
    rank's end), every rank's USS/PSS/RSS. Returns to the driver as rank 0's callback state."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self._t0, self._seeds, self._batches = 0.0, 0, 0

    def state_dict(self) -> Dict[str, Any]:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.rows = list(state["rows"])

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
        seconds, mem = time.perf_counter() - self._t0, psutil.Process().memory_full_info()
        mine = {"uss_mb": mem.uss / MB, "pss_mb": mem.pss / MB, "rss_mb": mem.rss / MB}
        self.rows.append({"seconds": seconds, "end_wall": time.time(), "seeds_all_ranks": int(totals[0]),
                          "batches_all_ranks": int(totals[1]), "ranks": gdist.all_gather_object(mine)})


def private_shm_prefix() -> List[str]:
    """A command prefix giving the process a private ``/dev/shm`` (root only), else []."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]


def run_arm(arm: str, cfg: Dict[str, Any], work: Path, private_shm: bool, timeout: float) -> Dict[str, Any]:
    """One arm in a fresh process (a private ``/dev/shm`` when asked); its result dict."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=work))
    cfg = dict(cfg, arm=arm, result=str(run_dir / "result.json"), work=str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(cfg))
    argv = (private_shm_prefix() if private_shm else []) + [sys.executable, SCRIPT, "--arm-worker",
                                                             str(run_dir / "config.json")]
    harness.run_process(argv, f"distgraph {arm}", timeout=timeout, env=child_env())
    res = json.loads((run_dir / "result.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    return res


def arm_worker(cfg_path: str) -> None:
    """One arm: start the memory watcher, build the task, fit, write the result JSON."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    work = Path(cfg["work"])
    samples, stop = work / "samples.jsonl", work / "stop"
    watcher = subprocess.Popen([sys.executable, SCRIPT, "--mem-watch", str(os.getpid()), str(samples), str(stop),
                                str(cfg["watch_interval_s"])], env=child_env())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (samples.exists() and samples.stat().st_size):
        time.sleep(0.05)  # a first sample (the driver alone) before anything starts
    try:
        # DistDGL: the task holds the partition's config; its ranks open the DistGraph.
        graph = workload.build_graph(cfg["spec"]) if cfg["arm"] == "fork" else cfg["part_config"]
        task = workload.BenchTask(graph, fanouts=cfg["fanouts"], hidden=cfg["hidden"], batch_size=cfg["batch_size"],
                                  lr=3e-3, dropout=0.5)
        probe = RankProbe()
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
    Path(cfg["result"]).write_text(json.dumps({"arm": cfg["arm"], "epochs": probe.rows, "fit_s": fit_s,
                                               "samples": rows}))


class RemoteFetchTask(workload.BenchTask):
    """The benchmark task on a 2-machine DistGraph: the remote share of each training batch's
    input nodes; at the epoch's end each rank in turn times fetching a batch's worth of
    features, all local and all remote, and writes ``rank<r>.json``."""

    def __init__(self, graph: Any, out_dir: str, reps: int, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self.out_dir, self.reps = out_dir, reps
        self._remote: List[float] = []
        self._sizes: List[int] = []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        book = self.graph.get_partition_book()
        self._remote.append(float((book.nid2partid(batch[0]) != book.partid).float().mean()))
        self._sizes.append(int(batch[0].numel()))

    def on_train_epoch_end(self) -> None:
        from graphtrainer import comm as gdist

        result = None
        for turn in range(self.world_size):  # one rank measures while the others wait
            gdist.barrier()
            if turn == self.rank:
                result = self._time_fetches()
        gdist.barrier()
        Path(self.out_dir, f"rank{self.rank}.json").write_text(json.dumps(result))

    def _time_fetches(self) -> Dict[str, Any]:
        import torch

        book, feat = self.graph.get_partition_book(), self.graph.ndata["feat"]
        me = book.partid
        pools = {"local": book.partid2nids(me),
                 "remote": torch.cat([book.partid2nids(p) for p in range(book.num_partitions()) if p != me])}
        size = int(statistics.median(self._sizes))
        gen = torch.Generator().manual_seed(7 + self.rank)
        times: Dict[str, List[float]] = {"local": [], "remote": []}
        for rep in range(self.reps + 1):  # local and remote interleaved; the first round warms up
            for kind, pool in pools.items():
                ids = pool[torch.randperm(len(pool), generator=gen)[:size]]
                t = time.perf_counter()
                feat[ids]
                if rep:
                    times[kind].append(1000 * (time.perf_counter() - t))
        row_bytes = torch.empty(0, dtype=feat.dtype).element_size() * int(torch.tensor(feat.shape[1:]).prod())
        return {"rank": self.rank, "ids": size, "row_bytes": row_bytes, "remote_fraction_mean": statistics.fmean(
            self._remote), **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}


def machine_worker(cfg_path: str) -> None:
    """One simulated machine: 1 trainer rank (+ this machine's graph server), 1 epoch."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    task = RemoteFetchTask(cfg["part_config"], cfg["out_dir"], cfg["reps"], fanouts=cfg["fanouts"],
                           hidden=cfg["hidden"], batch_size=cfg["batch_size"], lr=3e-3, dropout=0.5)
    with tempfile.TemporaryDirectory(prefix="distgraph-machine-") as root:
        Trainer(num_procs=1, distributed_graph=cfg["part_config"], ip_config=cfg["ip_config"], max_epochs=1,
                limit_train_batches=cfg["batches"], progress_bar=False, logger=False, enable_model_summary=False,
                default_root_dir=root, seed=0).fit(task)


if __name__ == "__main__" and sys.argv[1:2] == ["--arm-worker"]:
    arm_worker(sys.argv[2])
elif __name__ == "__main__" and sys.argv[1:2] == ["--machine"]:
    machine_worker(sys.argv[2])
