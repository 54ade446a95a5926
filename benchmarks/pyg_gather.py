"""What a PyG batch (``batch_format="pyg"``) gathers against what it keeps, and the time per batch,
gathering for the blocks then converting (A: how ``PygLoader`` made batches before) against sampling
the blocks without data and reading only the kept rows (B: ``PygLoader`` now), on DGL's CPU sampling
and the device sampler run on the CPU. One process, A B A B per configuration; the two arms' batches
are checked equal.

    python benchmarks/pyg_gather.py --out benchmarks/results/pyg_gather
    python benchmarks/pyg_gather.py --tiny

``--attrs-arm`` (results named ``pyg_attrs``): what carrying the graph's other node data (its
train/val/test masks, as PyG's NeighborLoader slices them) costs per batch, every key carried (the
default) against ``attrs=()``, both arms as ``PygLoader`` makes batches now.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
from graphtrainer import GraphTask, datasets
from graphtrainer.data.device import mode
from graphtrainer.nn.pyg import to_pyg

ARMS = {"before": "A: gather for the blocks, then convert", "after": "B: structure, then the kept rows"}
EDGE_DIM = 8  # "+edge": random edge data of this width, so edge rows are gathered too (the datasets have none)


def graph_of(name: str) -> Any:
    g = datasets.load(name.split("+")[0])
    if name.endswith("+edge"):
        g.edata["feat"] = torch.randn(g.num_edges(), EDGE_DIM, generator=torch.Generator().manual_seed(0))
    return g


def loader_of(g: Any, fanouts: List[int], batch_size: int, sampling: str, attrs: Any = None) -> Any:
    task = GraphTask()
    task.graph = g  # every node a seed: the shipped training splits are smaller than a few batches
    loader = task.node_dataloader(torch.arange(g.num_nodes()), fanouts, batch_size, batch_format="pyg", attrs=attrs)
    mode.place(loader, torch.device("cpu"), sampling, announce=False)
    return loader


def arm_batches(loader: Any, arm: str, count: int) -> List[Any]:
    keys = (loader.feat_key, loader.label_key, loader.edge_key)
    out = []
    source = iter(loader.inner) if arm == "before" else iter(loader)
    for batch in source:
        out.append(to_pyg(batch, *keys) if arm == "before" else batch)
        if len(out) == count:
            break
    return out


def counts(loader: Any, count: int) -> Dict[str, float]:
    """Rows per batch: node rows gathered for the blocks (every source node) and copied again into
    the batch where its nodes are not the blocks' own in order; kept (what B reads); edge rows likewise
    (A copies the kept ones always)."""
    rows: Dict[str, List[int]] = {k: [] for k in ("x_blocks", "x_copied", "x_kept", "e_blocks", "e_kept")}
    keys = (loader.feat_key, loader.label_key, loader.edge_key)
    edges = bool(loader.edge_key) and loader.edge_key in loader.graph.edata
    for i, (_, _, blocks) in enumerate(loader.inner):
        data = to_pyg(blocks, *keys)
        src = blocks[0].srcdata["_ID"].long()
        kept = data.n_id.numel()
        same = kept == src.numel() and torch.equal(data.n_id, src)
        rows["x_blocks"].append(src.numel())
        rows["x_copied"].append(0 if same else kept)
        rows["x_kept"].append(kept)
        rows["e_blocks"].append(sum(b.num_edges() for b in blocks) if edges else 0)
        rows["e_kept"].append(data.e_id.numel() if edges else 0)
        if i + 1 == count:
            break
    out = {k: sum(v) / len(v) for k, v in rows.items()}
    out["x_before"], out["x_after"] = out["x_blocks"] + out["x_copied"], out["x_kept"]
    out["e_before"], out["e_after"] = out["e_blocks"] + out["e_kept"], out["e_kept"]
    return out


def same_batches(a: List[Any], b: List[Any]) -> bool:
    return len(a) == len(b) and all(
        list(x.keys()) == list(y.keys()) and all(
            torch.equal(x[k], y[k]) if isinstance(y[k], torch.Tensor) else x[k] == y[k] for k in y.keys())
        for x, y in zip(a, b))


def timed(make: Any) -> Dict[str, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    n = len(make())
    return {"ms_per_batch": 1e3 * (time.perf_counter() - started) / n,
            "cpu_ms_per_batch": 1e3 * (time.process_time() - cpu) / n}


def train_steps(batches: List[Any], model: Any, opt: Any) -> List[Any]:
    """PyG's GraphSAGE step on each batch (what the batch costs is weighed against it)."""
    for batch in batches:
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch.y[:batch.batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return batches


def attrs_arm(args: Any) -> Dict[str, Any]:
    """Every other node key carried (the default) against attrs=(): CPU ms per batch (made, and made
    and trained on by PyG's GraphSAGE, hidden 64), interleaved."""
    from torch_geometric.nn import GraphSAGE

    args.bench_name = "pyg_attrs"
    arms = {"none": "attrs=(): x, y, edge_attr only", "all": "default: every other key (the masks) too",
            "none_step": "attrs=(), and a GraphSAGE step", "all_step": "default, and a GraphSAGE step"}
    rows = []
    for name in args.graphs:
        g = graph_of(name)
        model = GraphSAGE(g.ndata["feat"].shape[1], 64, num_layers=2, out_channels=int(g.ndata["label"].max()) + 1)
        opt = torch.optim.Adam(model.parameters())
        carried = sorted(k for k in g.ndata.keys() if k not in ("feat", "label", "_ID"))
        for fan in args.fanouts:
            fanouts = [int(f) for f in fan.split(",")]
            for bs in args.batch_sizes:
                for sampling in ("cpu", "device"):
                    loaders = {"none": loader_of(g, fanouts, bs, sampling, attrs=()),
                               "all": loader_of(g, fanouts, bs, sampling)}

                    def made(a: str) -> List[Any]:
                        batches = arm_batches(loaders[a.split("_")[0]], "after", args.batches)
                        return train_steps(batches, model, opt) if a.endswith("_step") else batches

                    label = f"{name} {fanouts} batch {bs} {sampling} attrs"
                    runs, _ = harness.interleave({a: (lambda r, a=a: timed(lambda: made(a))) for a in arms},
                                                 args.rounds, label, alternate=True)
                    cpu_ms = {a: harness.median([r["cpu_ms_per_batch"] for r in runs[a]]) for a in arms}
                    rows.append({"graph": name, "fanouts": fanouts, "batch_size": bs, "sampling": sampling,
                                 "carried": carried, "cpu_ms": cpu_ms, "ratio": cpu_ms["all"] / cpu_ms["none"],
                                 "step_ratio": cpu_ms["all_step"] / cpu_ms["none_step"],
                                 "runs": runs, "other_cores": harness.median(
                                     [r["other_cores"] for a in arms for r in runs[a]])})
    md = ("# PyG batches: the cost of carrying the graph's other node data (one process, "
          f"{args.threads} thread(s), {args.batches} batches x {args.rounds} rounds, every node a seed)\n\n"
          "all: the default, every node key besides x's and y's carried by n_id (here the masks); none: attrs=(). "
          "Both read only the kept rows. Batch: sampling and making it; + step: and PyG's GraphSAGE (hidden 64) "
          "trained on it.\n\n" + harness.markdown_table(
              ["graph", "fanouts", "batch", "sampling", "carried", "batch ms none", "batch ms all", "all / none",
               "+ step ms none", "+ step ms all", "all / none + step", "other cores"],
              [[r["graph"], str(r["fanouts"]), r["batch_size"], r["sampling"], ", ".join(r["carried"]),
                f"{r['cpu_ms']['none']:.2f}", f"{r['cpu_ms']['all']:.2f}", f"{r['ratio']:.3f}x",
                f"{r['cpu_ms']['none_step']:.2f}", f"{r['cpu_ms']['all_step']:.2f}", f"{r['step_ratio']:.3f}x",
                f"{r['other_cores']:.2f}"] for r in rows])
          + "\n\nCPU ms: this process's CPU time per batch, one thread (see pyg_gather.md).")
    headline = "other node keys carried / none: CPU ms per batch {:.2f}x to {:.2f}x, with a GraphSAGE step " \
        "{:.2f}x to {:.2f}x".format(*(f(r[k] for r in rows) for k in ("ratio", "step_ratio") for f in (min, max)))
    return harness.report(args, {"rows": rows, "arms": arms, "headline": headline}, md, harness.bar_plot(
        {f"{r['graph']} {r['batch_size']}\n{r['sampling']}": r["ratio"] for r in rows}, "all / none CPU ms per batch"))


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("pyg_gather", str(__doc__), rounds=5,
                            tiny={"graphs": ["cora"], "fanouts": ["5,5"], "batch_sizes": [64], "batches": 2})
    p.add_argument("--graphs", nargs="+", default=["cora", "tolokers", "tolokers+edge"],
                   help=f"shipped datasets; NAME+edge adds {EDGE_DIM}-wide random edge data")
    p.add_argument("--fanouts", nargs="+", default=["10,25", "5,10,15"], help="DGL's order, input layer first")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1024, 64])
    p.add_argument("--batches", type=int, default=10, help="batches timed per arm and round")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: DGL 2.1's fused sampler, taken with more, draws differently each run)")
    p.add_argument("--attrs-arm", action="store_true", help="only the cost of carrying the graph's other node data")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.attrs_arm:
        return attrs_arm(args)
    rows = []
    for name in args.graphs:
        g = graph_of(name)
        for fan in args.fanouts:
            fanouts = [int(f) for f in fan.split(",")]
            for bs in args.batch_sizes:
                for sampling in ("cpu", "device"):
                    loader = loader_of(g, fanouts, bs, sampling)
                    label = f"{name} {fanouts} batch {bs} {sampling}"
                    made: Dict[str, List[Any]] = {}

                    def run(arm: str, rnd: int) -> Dict[str, Any]:
                        started, cpu = time.perf_counter(), time.process_time()
                        made[arm] = arm_batches(loader, arm, args.batches)
                        n = len(made[arm])
                        return {"ms_per_batch": 1e3 * (time.perf_counter() - started) / n,
                                "cpu_ms_per_batch": 1e3 * (time.process_time() - cpu) / n}

                    runs, _ = harness.interleave({a: (lambda r, a=a: run(a, r)) for a in ARMS}, args.rounds, label)
                    ms = {a: harness.median([r["ms_per_batch"] for r in runs[a]]) for a in ARMS}
                    cpu_ms = {a: harness.median([r["cpu_ms_per_batch"] for r in runs[a]]) for a in ARMS}
                    other = harness.median([r["other_cores"] for a in ARMS for r in runs[a]])
                    rows.append({"graph": name, "fanouts": fanouts, "batch_size": bs, "sampling": sampling,
                                 "rows": counts(loader, args.batches), "ms": ms, "runs": runs, "other_cores": other,
                                 "cpu_ms": cpu_ms, "ratio": cpu_ms["after"] / cpu_ms["before"],
                                 "wall_ratio": ms["after"] / ms["before"],
                                 "same_batches": same_batches(made["after"], made["before"])})
    md = ("# PyG batches: rows gathered and kept, ms per batch (one process, "
          f"{args.threads} thread(s), {args.batches} batches x {args.rounds} rounds, every node a seed)\n\n"
          "A gathered x for every source node of the blocks and edge data for every block's edges, then "
          "copied the kept rows into the batch (x: unless they were the blocks' own, in order); B reads the kept "
          "rows once. kept / gathered: the nodes the batch keeps of those the blocks hold (the rest only DGL's "
          "re-sampling reached). Edge rows: only `+edge` graphs have edge data.\n\n" + harness.markdown_table(
              ["graph", "fanouts", "batch", "sampling", "x rows A: gathered + copied", "x rows B", "kept / gathered",
               "edge rows A: gathered + copied", "edge rows B",
               "CPU ms A", "CPU ms B", "B / A", "wall ms A", "wall ms B", "B / A wall", "same batches",
               "other cores"],
              [[r["graph"], str(r["fanouts"]), r["batch_size"], r["sampling"],
                f"{r['rows']['x_blocks']:,.0f} + {r['rows']['x_copied']:,.0f}", f"{r['rows']['x_kept']:,.0f}",
                f"{r['rows']['x_kept'] / r['rows']['x_blocks']:.3f}",
                f"{r['rows']['e_blocks']:,.0f} + {r['rows']['e_kept']:,.0f}", f"{r['rows']['e_kept']:,.0f}",
                f"{r['cpu_ms']['before']:.2f}", f"{r['cpu_ms']['after']:.2f}", f"{r['ratio']:.2f}x",
                f"{r['ms']['before']:.2f}", f"{r['ms']['after']:.2f}", f"{r['wall_ratio']:.2f}x",
                "yes" if r["same_batches"] else "NO", f"{r['other_cores']:.2f}"] for r in rows])
          + f"\n\nCPU ms: this process's CPU time per batch (one thread, no workers: the work done, less "
          "skewed by other work than wall time). other cores: CPU time used outside this process per second "
          f"(median of the runs); above {harness.NOISY_CORES} the machine was busy and wall times are noisy.")
    return harness.report(args, {"rows": rows, "arms": ARMS}, md, harness.bar_plot(
        {f"{r['graph']} {r['fanouts']}\n{r['batch_size']} {r['sampling']}": r["ratio"] for r in rows},
        "B / A CPU ms per batch"), figsize=(max(8, len(rows) * 0.9), 4.5))


if __name__ == "__main__":
    main()
