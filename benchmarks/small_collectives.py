"""What one small collective costs on this machine: the fixed per-epoch price of exact metrics.

    python benchmarks/small_collectives.py [--world-sizes 2 4] [--calls 300] [--out DIR]

Ranks pinned one per core (as ``pin_cpus=True``) time gloo's all-reduce of 4 numbers (sum,
max), an all-gather, a broadcast and a barrier, and a loopback TCP round trip for scale;
median of 5 blocks of ``--calls`` calls, rank 0's clock.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphtrainer.process.affinity import rank_cores
from graphtrainer.launch.environment import free_port
from harness import base_parser, markdown_table, write_outputs
from harness import machine_info, versions

BLOCKS = 5


def _ops(world: int) -> Dict[str, Callable[[], Any]]:
    four = torch.zeros(4, dtype=torch.float64)
    parts = [torch.empty_like(four) for _ in range(world)]
    return {
        "all_reduce sum (4 numbers)": lambda: dist.all_reduce(four.clone()),
        "all_reduce max (4 numbers)": lambda: dist.all_reduce(four.clone(), op=dist.ReduceOp.MAX),
        "all_gather (4 numbers)": lambda: dist.all_gather(parts, four),
        "broadcast (4 numbers)": lambda: dist.broadcast(four.clone(), 0),
        "barrier": dist.barrier,
    }


def _rank(rank: int, world: int, port: int, calls: int, out: Any) -> None:
    os.sched_setaffinity(0, rank_cores(rank, 1, os.sched_getaffinity(0)))  # as pin_cpus places ranks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for name, op in _ops(world).items():
            for _ in range(max(10, calls // 10)):  # warm-up
                op()
            blocks = []
            for _ in range(BLOCKS):
                start = time.perf_counter()
                for _ in range(calls):
                    op()
                blocks.append((time.perf_counter() - start) / calls * 1e6)
            if rank == 0:
                out[name] = statistics.median(blocks)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def tcp_round_trip_us(calls: int) -> float:
    """One byte there and back over loopback TCP between two processes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    pid = os.fork()
    if pid == 0:
        peer = socket.create_connection(server.getsockname())
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while peer.recv(1) == b"x":
            peer.send(b"x")
        os._exit(0)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    blocks = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(calls):
            conn.send(b"x")
            conn.recv(1)
        blocks.append((time.perf_counter() - start) / calls * 1e6)
    conn.send(b"q")
    conn.close()
    server.close()
    os.waitpid(pid, 0)
    return statistics.median(blocks)


def main(argv: List[str]) -> None:
    parser = base_parser("small_collectives", __doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed block (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.world_sizes, args.calls = [2], 20
    if any(w < 2 for w in args.world_sizes) or args.calls < 1:
        parser.error("--world-sizes: 2 or more ranks each; --calls: 1 or more")
    results: Dict[str, Dict[str, float]] = {}
    for world in args.world_sizes:
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(_rank, args=(world, free_port(), args.calls, out), nprocs=world)
            results[str(world)] = dict(out)
    rtt = tcp_round_trip_us(args.calls)
    names = list(next(iter(results.values())))
    rows = [[name] + [round(results[str(w)][name]) for w in args.world_sizes] for name in names]
    rows.append(["loopback TCP round trip (2 processes)"] + [round(rtt)] + [None] * (len(args.world_sizes) - 1))
    table = markdown_table(["operation (gloo, ranks pinned one per core)"]
                           + [f"{w} ranks, us/call" for w in args.world_sizes], rows)
    payload = {"machine": machine_info(), "calls": args.calls, "blocks": BLOCKS, "us_per_call": results,
               "tcp_round_trip_us": rtt, "versions": versions()}
    md = (f"# Small collectives, torch {torch.__version__}\n\n{table}\n\n"
          f"Median of {BLOCKS} blocks of {args.calls} calls, rank 0's clock.\n")

    def plot(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for i, w in enumerate(args.world_sizes):
            ax.barh([j + i * 0.4 for j in range(len(names))], [results[str(w)][n] for n in names], height=0.4,
                    label=f"{w} ranks")
        ax.set_yticks(range(len(names)), names)
        ax.axvline(rtt, color="k", linestyle="--", label="TCP round trip")
        ax.set_xlabel("us per call")
        ax.legend()

    paths = write_outputs(args.out, "small_collectives", payload, md, plot, figsize=(9, 4))
    print(md)
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main(sys.argv[1:])
