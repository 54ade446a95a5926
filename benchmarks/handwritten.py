"""The hand-written DDP training the benchmarks compare graphtrainer with, in the style of DGL's
classic multi-GPU tutorial, and its naive spawn launch (the graph pickled into every child)."""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
import threading
import time
from typing import Any, Dict, List

from probe import Probe
from workload import evaluate, split_ids


def handwritten_rank(rank: int, world: int, port: int, conn: Any, cfg: Dict[str, Any]) -> None:
    """One rank on its graph unpickled from ``conn``: DDP, ``DataLoader(use_ddp=True)``, ``loss.item()`` per step.
    ``cfg``: ``workload.task_kwargs``, epochs, threads, seed; optional probe_dir, pause_at, measure_steps (a
    :class:`Probe`), max_steps, out_file (rank 0's epoch times, step ends, test metrics), join (epochs in ``Join``)."""
    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
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
    if rank == 0 and cfg.get("out_file"):
        metrics = evaluate(model.module, g, split_ids(g, "test"))
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


def naive_spawn(graph: Any, world: int, cfg: Dict[str, Any], teardown_timeout_s: float = 60.0) -> None:
    """Run ``handwritten_rank`` on ``world`` ranks as the classic tutorials do: spawn, the graph pickled
    (as ``mp.spawn`` does) and piped to every child (this process keeps no bytes), each unpickling its copy.
    ``cfg["fresh_thread"]``: each rank trains in a new thread."""
    import multiprocessing as mp

    from graphtrainer.launch.environment import free_port

    ctx = mp.get_context("spawn")
    data = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
    port = free_port()
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
