"""``distgraph.py`` part 2: remote feature fetches on 2 simulated machines (network
namespaces, 1 trainer each). Each training batch's input nodes are classified with the
partition book; at the epoch's end each rank in turn times ``g.ndata["feat"][ids]`` for ids
all local and all remote. The "network" is a veth pair: DGL's RPC and copy costs.

    python benchmarks/distgraph_remote.py CONFIG.json     # one machine, started by distgraph.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness
import workload
from distgraph_arm import child_env

NAME = "distgraph"
MB = 1024 * 1024
SCRIPT = os.path.abspath(__file__)


def _mean(xs: List[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


class RemoteFetchTask(workload.BenchTask):
    """The benchmark task on a 2-machine DistGraph, recording which input nodes of each
    training batch are remote, then timing local and remote feature fetches at the
    epoch's end (each rank in turn) and writing ``rank<r>.json`` to ``out_dir``."""

    def __init__(self, graph: Any, out_dir: str, reps: int, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self.out_dir, self.reps = out_dir, reps
        self._remote_frac: List[float] = []
        self._seed_remote: List[float] = []
        self._sizes: List[int] = []
        self._kept: List[Any] = []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        book = self.graph.get_partition_book()
        input_nodes, output_nodes = batch[0], batch[1]
        self._remote_frac.append(float((book.nid2partid(input_nodes) != book.partid).float().mean()))
        self._seed_remote.append(float((book.nid2partid(output_nodes) != book.partid).float().mean()))
        self._sizes.append(int(input_nodes.numel()))
        if len(self._kept) < 3:
            self._kept.append(input_nodes.clone())

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

        g = self.graph
        book = g.get_partition_book()
        me = book.partid
        pools = {"local": book.partid2nids(me),
                 "remote": torch.cat([book.partid2nids(p) for p in range(book.num_partitions()) if p != me])}
        feat = g.ndata["feat"]
        row_bytes = torch.empty(0, dtype=feat.dtype).element_size() * int(torch.tensor(feat.shape[1:]).prod())
        n_input = int(statistics.median(self._sizes))
        sizes = sorted({min(self.batch_size, n_input), n_input})
        gen = torch.Generator().manual_seed(7 + self.rank)

        def fetch(ids: Any) -> float:
            t = time.perf_counter()
            feat[ids]
            return time.perf_counter() - t

        rows = []
        for size in sizes:
            picks = {k: [pool[torch.randperm(len(pool), generator=gen)[:size]] for _ in range(self.reps + 1)]
                     for k, pool in pools.items()}
            times: Dict[str, List[float]] = {"local": [], "remote": []}
            for rep in range(self.reps + 1):
                for kind in ("local", "remote"):
                    seconds = fetch(picks[kind][rep])
                    if rep:  # the first round warms up
                        times[kind].append(seconds)
            for kind, vals in times.items():
                s = statistics.median(vals)
                rows.append({"ids": size, "kind": kind, "ms": 1000 * s, "mb_per_s": size * row_bytes / MB / s,
                             "ms_all": [1000 * v for v in vals]})
        sampled = []
        for ids in self._kept:
            fetch(ids)
            s = statistics.median([fetch(ids) for _ in range(self.reps)])
            frac = float((book.nid2partid(ids) != me).float().mean())
            sampled.append({"ids": int(ids.numel()), "remote_fraction": frac, "ms": 1000 * s,
                            "mb_per_s": ids.numel() * row_bytes / MB / s})
        return {"rank": self.rank, "partition": int(me), "local_nodes": int(pools["local"].numel()),
                "row_bytes": row_bytes, "fetch": rows, "sampled_batches": sampled,
                "batches": len(self._remote_frac), "input_nodes_median": n_input,
                "remote_fraction_mean": _mean(self._remote_frac),
                "remote_fraction_min": min(self._remote_frac), "remote_fraction_max": max(self._remote_frac),
                "seed_remote_fraction_mean": _mean(self._seed_remote)}


def machine_worker(cfg_path: str) -> None:
    """One simulated machine: 1 trainer rank (+ this machine's graph server), 1 epoch."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    task = RemoteFetchTask(cfg["part_config"], cfg["out_dir"], cfg["reps"], fanouts=cfg["fanouts"],
                           hidden=cfg["hidden"], batch_size=cfg["batch_size"], lr=3e-3, dropout=0.5)
    with tempfile.TemporaryDirectory(prefix="distgraph-machine-") as root:
        trainer = Trainer(num_procs=1, distributed_graph=cfg["part_config"], ip_config=cfg["ip_config"],
                          max_epochs=1, limit_train_batches=cfg["batches"], progress_bar=False, logger=False,
                          enable_model_summary=False, default_root_dir=root, seed=0)
        trainer.fit(task)


def remote_part(part_config: str, cfg: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Part 2 on 2 simulated machines; ``{"skipped": why}`` when they cannot be made here,
    ``{"failed": what}`` (with the machines' log tails) when the run fails."""
    from graphtrainer.testing import simulated_machines as sm

    ok, why = sm.can_simulate()
    if not ok:
        print(f"[{NAME}] remote fetches skipped: {why}", flush=True)
        return {"skipped": why}
    load = round(os.getloadavg()[0], 2)
    machines = sm.SimulatedMachines(2)
    failed = None
    with tempfile.TemporaryDirectory(prefix="distgraph-remote-") as work, machines, harness.LoadMeter() as meter:
        ip = machines.ip_config(os.path.join(work, "ip_config.txt"))
        path = os.path.join(work, "config.json")
        Path(path).write_text(json.dumps(dict(cfg, part_config=part_config, ip_config=ip, out_dir=work)))
        logs = [open(os.path.join(work, f"machine{m}.log"), "wb") for m in range(2)]
        try:
            procs = [machines.popen(m, [sys.executable, SCRIPT, path], stdout=logs[m],
                                    stderr=subprocess.STDOUT, env=child_env())
                     for m in range(2)]
            try:
                bad = sm.wait_all(procs, timeout)
            except TimeoutError as err:
                bad = str(err)
        finally:
            for fh in logs:
                fh.close()
        if bad is not None:
            tails = "\n".join(f"--- machine {m} ---\n" + Path(work, f"machine{m}.log").read_text(errors="replace")[-3000:]
                              for m in range(2))
            failed = f"simulated machines failed ({bad}):\n{tails}"
        else:
            ranks = [json.loads(Path(work, f"rank{r}.json").read_text()) for r in range(2)]
    left = machines.existing()  # after close(): the namespaces must be gone
    if failed is not None:
        print(f"[{NAME}] {failed}", file=sys.stderr, flush=True)
        return {"failed": failed, "namespaces_left": left}
    return {"ranks": ranks, "addresses": list(machines.addresses), "loadavg_1min_before": load,
            "other_cores": meter.other_cores, "namespaces_left": left, "summary": summarize_remote(ranks)}


def summarize_remote(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Remote share of training batches' input nodes; local and remote fetch of a batch's
    input nodes (medians over ranks)."""
    out: Dict[str, Any] = {
        "remote_fraction_mean": _mean([r["remote_fraction_mean"] for r in ranks]),
        "remote_fraction_range": [min(r["remote_fraction_min"] for r in ranks),
                                  max(r["remote_fraction_max"] for r in ranks)],
        "seed_remote_fraction_mean": _mean([r["seed_remote_fraction_mean"] for r in ranks])}
    for kind in ("local", "remote"):
        cells = [f for r in ranks for f in r["fetch"] if f["kind"] == kind and f["ids"] == r["input_nodes_median"]]
        out[f"{kind}_ms_input_nodes"] = statistics.median([c["ms"] for c in cells])
        out[f"{kind}_mb_per_s_input_nodes"] = statistics.median([c["mb_per_s"] for c in cells])
    out["remote_over_local"] = out["remote_ms_input_nodes"] / out["local_ms_input_nodes"]
    return out

def remote_markdown(remote: Optional[Dict[str, Any]], reps: int) -> str:
    md: List[str] = []
    md.append("\n## 2. Remote feature fetches (2 simulated machines, 1 trainer each)\n")
    if remote is None:
        md.append("Not run (--skip-remote).")
    elif "skipped" in remote:
        md.append(f"Skipped: {remote['skipped']}.")
    elif "failed" in remote:
        md.append("Failed:\n\n```\n" + remote["failed"][-2000:] + "\n```")
    else:
        headers = ["rank", "ids per fetch", "local ms", "remote ms", "remote / local", "local MB/s", "remote MB/s"]
        rows = []
        for r in remote["ranks"]:
            by = {}
            for f in r["fetch"]:
                by.setdefault(f["ids"], {})[f["kind"]] = f
            for ids, kinds in sorted(by.items()):
                lo, re_ = kinds["local"], kinds["remote"]
                rows.append([r["rank"], f"{ids:,}", f"{lo['ms']:.2f}", f"{re_['ms']:.2f}", f"{re_['ms'] / lo['ms']:.1f}x",
                             f"{lo['mb_per_s']:,.0f}", f"{re_['mb_per_s']:,.0f}"])
        md.append(harness.markdown_table(headers, rows))
        s = remote["summary"]
        md.append(f"\nRemote input nodes in a training batch (each machine's own seeds): mean "
                  f"{100 * s['remote_fraction_mean']:.1f}% (batches {100 * s['remote_fraction_range'][0]:.1f}-"
                  f"{100 * s['remote_fraction_range'][1]:.1f}%); remote seeds {100 * s['seed_remote_fraction_mean']:.1f}%.")
        rows = [[r["rank"], f"{b['ids']:,}", f"{100 * b['remote_fraction']:.1f}%", f"{b['ms']:.2f}",
                 f"{b['mb_per_s']:,.0f}"] for r in remote["ranks"] for b in r["sampled_batches"]]
        md.append("\nFetching the input nodes of real training batches, as sampled:\n")
        md.append(harness.markdown_table(["rank", "input nodes", "remote", "ms", "MB/s"], rows))
        md.append(f"\nRow size {remote['ranks'][0]['row_bytes']} B; medians of {reps} fetches per cell, "
                  f"local and remote interleaved, one rank measuring at a time; load before "
                  f"{remote['loadavg_1min_before']}, other load {remote['other_cores']:.2f} cores.")
    return "\n".join(md)


if __name__ == "__main__":
    machine_worker(sys.argv[1])
