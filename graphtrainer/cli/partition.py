"""``python -m graphtrainer.cli.partition``: partition a graph for DistDGL from the command line.

    python -m graphtrainer.cli.partition --dataset cora --parts 2 --out parts/
    python -m graphtrainer.cli.partition --graph g.bin --parts 4 --out parts/ --features feat,label

Outside the engine (it reads the shipped datasets); the work is
:func:`graphtrainer.distdgl.partition.partition_graph`, which describes the output.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

import dgl

from .. import datasets
from .._moved import moved_name
from ..distdgl.partition import METHODS, PartitionSummary, partition_graph


def __getattr__(name: str) -> Any:
    """Names that moved to :mod:`graphtrainer.distdgl.partition` still work at this module's
    old path (``graphtrainer.partition``, served by :data:`graphtrainer._moved.MOVED`), with a warning."""
    return moved_name("graphtrainer.partition", name)  # the path these names left


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m graphtrainer.cli.partition",
                                description="Partition a graph for DistDGL (dgl.distributed.partition_graph).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a shipped dataset (graphtrainer.datasets.KNOWN)")
    src.add_argument("--graph", help="a DGL binary file (dgl.save_graphs); its first graph is used")
    p.add_argument("--parts", type=int, required=True, help="number of parts K")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--name", help="graph name: file names and DistGraph's name (default: dataset or file stem)")
    p.add_argument("--method", choices=METHODS, default="metis")
    p.add_argument("--halo-hops", type=int, default=1, help="hops of halo nodes kept per part (default 1)")
    p.add_argument("--balance-train", action=argparse.BooleanOptionalAction, default=None,
                   help="METIS balances training nodes over parts (default on; METIS only)")
    p.add_argument("--train-mask", default="train_mask", help="node data key of the train mask")
    p.add_argument("--features", help="comma-separated node data keys to keep (default: all); "
                                      "*_mask keys are always kept")
    p.add_argument("--overwrite", action="store_true", help="replace a partition of that name in --out")
    p.add_argument("--verbose", action="store_true", help="also print DGL's own log")
    return p


def _load_graph(args: argparse.Namespace) -> dgl.DGLGraph:
    if args.dataset is not None:
        if args.dataset.strip().lower() not in datasets.KNOWN:
            raise ValueError(f"unknown dataset {args.dataset!r}; known datasets: {', '.join(datasets.KNOWN)} "
                             "(or give a DGL binary file with --graph)")
        try:
            return datasets.load(args.dataset)
        except FileNotFoundError as err:  # data folder missing: a refusal like the others
            raise ValueError(str(err)) from None
    path = pathlib.Path(args.graph)
    if not path.is_file():
        raise ValueError(f"graph file not found: {path} (give a file written by dgl.save_graphs)")
    try:
        graphs, _ = dgl.load_graphs(str(path))
    except Exception as err:  # DGL raises DGLError for foreign or corrupt files
        raise ValueError(f"{path} is not a DGL binary graph file ({err}); write it with dgl.save_graphs") from None
    if not graphs:
        raise ValueError(f"{path} holds no graph; write one with dgl.save_graphs")
    return graphs[0]


def main(argv: Optional[Sequence[str]] = None) -> PartitionSummary:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``) and return the summary.
    A refusal prints ``error: <message>`` to stderr and exits with status 2."""
    start = time.perf_counter()
    args = _parser().parse_args(argv)
    try:
        if args.method == "random" and args.balance_train:
            print("note: --balance-train has no effect with --method random (METIS only)", file=sys.stderr)
        if args.parts < 1:  # before loading a dataset for nothing
            raise ValueError(f"--parts {args.parts}: give at least 1 part")
        if args.halo_hops < 1:
            raise ValueError(f"--halo-hops {args.halo_hops}: DistDGL needs at least 1 hop; give 1 or more")
        graph = _load_graph(args)
        name = args.name or (args.dataset.strip().lower() if args.dataset else pathlib.Path(args.graph).stem)
        features = None if args.features is None else [k.strip() for k in args.features.split(",") if k.strip()]
        summary = partition_graph(graph, name, args.parts, args.out, method=args.method,
                                  halo_hops=args.halo_hops, balance_train=args.balance_train is not False,
                                  train_mask=args.train_mask, features=features, overwrite=args.overwrite)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.verbose:
        print(summary.dgl_log, end="")
    print(summary.table())
    print(f"time: {time.perf_counter() - start:.2f} s (partitioning and writing {summary.seconds:.2f} s)")
    return summary


if __name__ == "__main__":
    main()
