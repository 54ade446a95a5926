"""What one small gloo collective costs here: the fixed per-epoch price of exact metrics.

Ranks pinned one per core (as ``pin_cpus=True``) time all-reduces of 4 numbers (sum, max), an all-gather, a
broadcast and a barrier (rank 0's clock); a loopback TCP round trip between two processes gives the scale."""
from __future__ import annotations

import os
import socket
import timeit
from typing import Any, Callable, Dict

import harness  # first: graphtrainer from this checkout
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from graphtrainer.launch.environment import free_port
from graphtrainer.process.affinity import rank_cores

BLOCKS = 5


def us_per_call(op: Callable[[], Any], calls: int) -> float:
    """The median of BLOCKS blocks of ``calls`` calls, after one more as a warm-up."""
    return harness.median(timeit.repeat(op, number=calls, repeat=BLOCKS + 1)[1:]) / calls * 1e6


def _rank(rank: int, world: int, port: int, calls: int, queue: Any) -> None:
    os.sched_setaffinity(0, rank_cores(rank, 1, os.sched_getaffinity(0)))  # as pin_cpus places ranks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    four = torch.zeros(4, dtype=torch.float64)
    parts = [torch.empty_like(four) for _ in range(world)]
    ops = {"all_reduce sum (4 numbers)": lambda: dist.all_reduce(four.clone()),
           "all_reduce max (4 numbers)": lambda: dist.all_reduce(four.clone(), op=dist.ReduceOp.MAX),
           "all_gather (4 numbers)": lambda: dist.all_gather(parts, four),
           "broadcast (4 numbers)": lambda: dist.broadcast(four.clone(), 0), "barrier": dist.barrier}
    timed = {name: us_per_call(op, calls) for name, op in ops.items()}
    if rank == 0:
        queue.put(timed)
    dist.barrier()  # no rank leaves while another still waits on it
    dist.destroy_process_group()


def tcp_round_trip_us(calls: int) -> float:
    """One byte there and back over loopback TCP between two processes (a forked echoing peer)."""
    server = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:
        peer = socket.create_connection(server.getsockname())
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while peer.recv(1) == b"x":
            peer.send(b"x")
        os._exit(0)
    conn = server.accept()[0]
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    us = us_per_call(lambda: (conn.send(b"x"), conn.recv(1)), calls)
    conn.send(b"q")  # the peer leaves
    os.waitpid(pid, 0)
    return us


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("small_collectives", __doc__, tiny={"world_sizes": [2], "calls": 20})
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed block (default: %(default)s)")
    args = parser.parse_args(argv)
    if any(w < 2 for w in args.world_sizes) or args.calls < 1:
        parser.error("--world-sizes: 2 or more ranks each; --calls: 1 or more")
    results: Dict[str, Dict[str, float]] = {}
    for world in args.world_sizes:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(_rank, args=(world, free_port(), args.calls, queue), nprocs=world)
        results[str(world)] = queue.get()
    rtt = tcp_round_trip_us(args.calls)
    rows = [[name] + [round(results[str(w)][name]) for w in args.world_sizes] for name in results[str(world)]]
    rows.append(["loopback TCP round trip (2 processes)", round(rtt)] + [None] * (len(args.world_sizes) - 1))
    md = (f"# Small collectives, torch {torch.__version__}\n\n" + harness.markdown_table(
        ["operation (gloo, ranks pinned one per core)"] + [f"{w} ranks, us/call" for w in args.world_sizes], rows)
        + f"\n\nMedian of {BLOCKS} blocks of {args.calls} calls, rank 0's clock.\n")
    bars = {f"{op.removesuffix(' (4 numbers)')}\n{w} ranks": us for w, ops in results.items() for op, us in ops.items()}
    payload = {"calls": args.calls, "blocks": BLOCKS, "us_per_call": results, "tcp_round_trip_us": rtt}
    return harness.report(args, payload, md, harness.bar_plot(dict(bars, **{"TCP round trip": rtt}), "us per call"),
                          figsize=(12, 4))

if __name__ == "__main__":
    main()
