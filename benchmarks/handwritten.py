"""The hand-written DDP training the benchmarks compare graphtrainer with, in the style of
DGL's classic multi-GPU node-classification tutorial, and its naive spawn launch (the graph
pickled into every child)."""
from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
from typing import Any, Dict, List

from probe import Probe
from workload import evaluate, split_ids


def handwritten_rank(rank: int, world: int, port: int, graph_or_box: Any, cfg: Dict[str, Any]) -> None:
    """One rank of the tutorial-style script: its own process group, DDP, DGL's
    ``DataLoader(use_ddp=True)``, ``loss.item()`` every step. ``graph_or_box``: the graph or a
    one-item list of its pickled bytes (dropped once unpickled, as with ``mp.spawn``). ``cfg``:
    fanouts, hidden, batch_size, lr, dropout, epochs, threads, seed; optional probe_dir,
    pause_at, measure_steps (a :class:`Probe`), max_steps, out_file (rank 0's epoch times and
    test metrics), join (each epoch in ``Join``), fresh_thread (train in a new thread)."""
    import contextlib

    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    from graphtrainer.models import SAGE

    torch.set_num_threads(cfg["threads"])
    dgl.utils.set_num_threads(cfg["threads"])
    g = pickle.loads(graph_or_box.pop()) if isinstance(graph_or_box, list) else graph_or_box
    del graph_or_box
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    torch.manual_seed(cfg["seed"])
    num_classes = int(g.ndata["label"].max()) + 1
    model = SAGE(g.ndata["feat"].shape[1], cfg["hidden"], num_classes, num_layers=len(cfg["fanouts"]),
                 dropout=cfg["dropout"])
    model = DistributedDataParallel(model)
    sampler = dgl.dataloading.NeighborSampler(list(cfg["fanouts"]), prefetch_node_feats=["feat"],
                                              prefetch_labels=["label"])
    train_idx = split_ids(g, "train")
    loader = dgl.dataloading.DataLoader(g, train_idx, sampler, batch_size=cfg["batch_size"], shuffle=True,
                                        drop_last=False, num_workers=0, use_ddp=True)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    probe = Probe(cfg["probe_dir"], cfg["pause_at"], cfg["measure_steps"]) if cfg.get("probe_dir") else None
    if probe is not None:
        probe.fit_start(rank)
    max_steps = cfg.get("max_steps")
    epoch_times: List[float] = []
    step_ends: List[List[float]] = []  # per epoch: seconds from the epoch's start to each step's end
    step = 0
    for epoch in range(cfg["epochs"]):
        model.train()
        t0 = time.perf_counter()
        total_loss = 0.0
        ends: List[float] = []
        step_ends.append(ends)
        with (Join([model]) if cfg.get("join") else contextlib.nullcontext()):
            for it, (input_nodes, output_nodes, blocks) in enumerate(loader):
                x = blocks[0].srcdata["feat"]
                y = blocks[-1].dstdata["label"]
                y_hat = model(blocks, x)
                loss = F.cross_entropy(y_hat, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total_loss += loss.item()
                step += 1
                ends.append(time.perf_counter() - t0)
                if probe is not None:
                    probe.step_end(rank, output_nodes.shape[0])
                if max_steps is not None and step >= max_steps:
                    break
        epoch_times.append(time.perf_counter() - t0)
        if max_steps is not None and step >= max_steps:
            break
    if rank == 0 and cfg.get("out_file"):
        metrics = evaluate(model.module, g, split_ids(g, "test"))
        with open(cfg["out_file"], "w", encoding="utf-8") as fh:
            json.dump({"epoch_times_s": epoch_times, "step_ends_s": step_ends, **metrics}, fh)
    dist.barrier()
    if not cfg.get("join"):
        # torch 2.2 + gloo: under Join, DDP leaves un-awaited async all-reduces behind; freeing
        # the DDP reducer then deadlocks (the main thread holds the GIL while joining a gloo
        # worker that needs it to free a tensor). So only the plain loop tears down.
        dist.destroy_process_group()
    # The work is done; leave without interpreter finalization, as a forked process does. On
    # torch 2.15 a gloo thread still holding a tensor (the DDP reducer keeps the group alive
    # past destroy_process_group) can free it during finalization and abort the process
    # ("terminate called without an active exception", pytorch/pytorch#190489): one CI run
    # of overhead.py lost its hand-written arm that way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _naive_child(rank: int, world: int, port: int, conn: Any, cfg: Dict[str, Any]) -> None:
    if sys.platform.startswith("linux"):  # die with the launching process (not what tutorials do;
        try:                              # it keeps a killed benchmark from leaving ranks behind)
            import ctypes

            ctypes.CDLL("libc.so.6").prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        except OSError:
            pass
    box = [conn.recv_bytes()]  # this rank's own copy of the pickled graph
    conn.close()
    if not cfg.get("fresh_thread"):
        handwritten_rank(rank, world, port, box, cfg)
        return
    # Ablation (overhead.py --thread-arm): train in a new thread, as graphtrainer's launched
    # ranks do (its work-around for the OpenMP fork hang), instead of the main thread.
    failed: List[BaseException] = []

    def target() -> None:
        try:
            handwritten_rank(rank, world, port, box, cfg)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            failed.append(err)

    worker = threading.Thread(target=target, name=f"naive-rank{rank}-train")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def naive_spawn(graph: Any, world: int, cfg: Dict[str, Any], teardown_timeout_s: float = 60.0) -> None:
    """Launch ``handwritten_rank`` the way the classic tutorials do: spawn, with the graph
    pickled (plain ``pickle.dumps``, as ``mp.spawn`` does with its arguments) and sent to
    every child, which unpickles its own private copy. The bytes go through a pipe so the
    parent does not keep them alive, and each child drops its bytes once unpickled."""
    import multiprocessing as mp

    from graphtrainer.launch.environment import free_port

    ctx = mp.get_context("spawn")
    data = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
    port = free_port()
    procs, conns = [], []
    ended: set = set()  # ranks this function killed after another rank failed
    try:
        for r in range(world):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_naive_child, args=(r, world, port, recv, cfg), name=f"naive-rank{r}")
            p.start()
            recv.close()
            procs.append(p)
            conns.append(send)
        for send in conns:
            send.send_bytes(data)
            send.close()
        del data
        # Like the tutorials there is no watchdog in the ranks; here, at least, one failed
        # rank ends the others instead of leaving them blocked in a collective.
        first_done = None
        while True:
            alive = [p for p in procs if p.exitcode is None]
            if not alive or any(p.exitcode not in (None, 0) for p in procs):
                break
            if first_done is None and len(alive) < len(procs):
                first_done = time.monotonic()
            if first_done is not None and time.monotonic() - first_done > teardown_timeout_s:
                print(f"[bench] naive spawn: {len(alive)} rank(s) still tearing down {teardown_timeout_s:.0f} s "
                      "after another finished; ending them", file=sys.stderr, flush=True)
                for p in alive:
                    p.kill()
                    p.join(5)
                    p.exitcode_override = 0  # their work was done: all ranks passed the final barrier
                break
            alive[0].join(0.2)
    finally:
        for r, p in enumerate(procs):  # only after a failure here: end the ranks still running
            if p.exitcode is None:
                ended.add(r)
                p.kill()
                p.join(5)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0 and not hasattr(p, "exitcode_override")]
    if bad:
        first = ", ".join(f"rank {r} exit code {code}" for r, code in bad if r not in ended)
        raise RuntimeError(f"naive spawn ranks failed: {first or bad}" +
                           (f"; rank(s) {sorted(ended)} were then ended by the benchmark" if ended else ""))
