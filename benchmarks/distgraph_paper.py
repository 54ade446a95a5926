"""``distgraph.py`` part 3: what a partition of ogbn-papers100M holds per machine (a model of
DGL 2.1's layout, :func:`paper_rows`), and the halo measurement it takes its ratios from."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import harness
import workload

NAME = "distgraph"
MB = 1024 * 1024
GB = 1e9


#: ogbn-papers100M as OGB ships it (directed citation edges; DGL users often add the
#: reverses, which doubles every per-edge figure below). Split sizes from OGB's split.
PAPERS100M = {"name": "ogbn-papers100M", "nodes": 111_059_956, "edges": 1_615_685_872, "feat_dim": 128,
              "train": 1_207_179, "val": 125_265, "test": 214_338}

#: Halo nodes per inner node, edges a part stores per inner edge and the cut fraction, measured
#: on the synthetic 1Mx10 graph in K METIS parts, 1 halo hop (``distgraph.py --measure-halo``,
#: results/distgraph/halo.json). A random graph with 8 classes: pessimistic for papers100M.
HALO_MEASURED = {
    2: {"halo_per_inner": 0.723, "edges_per_inner_edge": 1.204, "cut_fraction": 0.204},
    4: {"halo_per_inner": 1.229, "edges_per_inner_edge": 1.186, "cut_fraction": 0.186},
    8: {"halo_per_inner": 1.699, "edges_per_inner_edge": 1.218, "cut_fraction": 0.218},
    16: {"halo_per_inner": 4.404, "edges_per_inner_edge": 1.674, "cut_fraction": 0.674},
}


def _int64(n: float) -> float:
    return 8.0 * n


def paper_rows(graph: Dict[str, Any] = PAPERS100M, machines: Sequence[int] = (4, 8, 16),
               halo: Optional[Dict[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Bytes per machine of DGL 2.1's partitioned layout (``dgl/distributed/partition.py``,
    ``dist_graph.py``), and of one machine holding the whole graph. A graph server holds in
    shared memory its inner nodes' data (float32 ``feat``, int64 ``label``, 3 bool masks) and
    the part graph over inner + halo nodes as CSC (DGL's default ``graph_format``) with its
    edge ids, ``_ID``/``inner_*`` per node and edge (17 B per node, 25 B per edge). One machine
    (fork launcher): every node's data, COO (as built) and CSC with edge ids."""
    halo = halo if halo is not None else HALO_MEASURED
    n, e, f = graph["nodes"], graph["edges"], graph["feat_dim"]
    rows: List[Dict[str, Any]] = []
    single = {"machines": 1, "layout": "one machine, in-memory DGLGraph", "inner_nodes": n, "halo_nodes": 0,
              "edges_held": e, "features_b": 4.0 * f * n, "other_ndata_b": 11.0 * n,
              "csc_b": _int64(n + 1) + _int64(e), "eid_b": _int64(e), "coo_b": 2 * _int64(e), "ids_flags_b": 0.0}
    rows.append(single)
    for k in machines:
        h = halo.get(k) or {}
        ratio, edge_factor = h.get("halo_per_inner"), h.get("edges_per_inner_edge")
        if ratio is None or edge_factor is None:
            ratio, edge_factor = _extrapolate(halo, k)
            assumed = "extrapolated"
        else:
            assumed = "measured on the synthetic graph"
        inner = n / k
        halo_nodes = inner * ratio
        nodes = inner + halo_nodes
        edges = e / k * edge_factor
        rows.append({"machines": k, "layout": f"DistDGL, {k} parts", "inner_nodes": inner, "halo_nodes": halo_nodes,
                     "halo_source": assumed, "halo_per_inner": ratio, "edges_per_inner_edge": edge_factor,
                     "edges_held": edges, "features_b": 4.0 * f * inner, "other_ndata_b": 11.0 * inner,
                     "csc_b": _int64(nodes + 1) + _int64(edges), "eid_b": 2 * _int64(edges),
                     "coo_b": 0.0, "ids_flags_b": _int64(nodes) + nodes + edges})
    total0 = None
    for row in rows:
        if row["machines"] > 1 or row["layout"].startswith("DistDGL"):
            # Lower bound: no halo node, no cut edge (inner nodes and their in-edges only).
            inner, edges = row["inner_nodes"], e / row["machines"]
            row["total_no_cut_b"] = (_int64(inner + 1) + _int64(edges) + 2 * _int64(edges) + _int64(inner) + inner
                                     + edges + (4.0 * f + 11) * inner)
        row["structure_b"] = row["csc_b"] + row["eid_b"] + row["coo_b"] + row["ids_flags_b"]
        row["total_b"] = row["structure_b"] + row["features_b"] + row["other_ndata_b"]
        total0 = total0 or row["total_b"]
        row["vs_one_machine"] = row["total_b"] / total0
        row["train_per_machine"] = graph.get("train", 0) / row["machines"]
    return rows


def _extrapolate(halo: Dict[int, Dict[str, Any]], k: int) -> tuple:
    """Halo/inner and edge factor for ``k`` parts from the largest measured part counts:
    linear in log2(k) through the two largest measured points (halo), the largest one's
    edge factor (the cut fraction changes little with k on that graph)."""
    known = sorted(p for p, v in halo.items() if v.get("halo_per_inner") is not None)
    if not known:
        return 1.0, 1.2
    if len(known) == 1:
        return halo[known[0]]["halo_per_inner"], halo[known[0]]["edges_per_inner_edge"]
    import math

    a, b = known[-2], known[-1]
    ra, rb = halo[a]["halo_per_inner"], halo[b]["halo_per_inner"]
    slope = (rb - ra) / (math.log2(b) - math.log2(a))
    return rb + slope * (math.log2(k) - math.log2(b)), halo[b]["edges_per_inner_edge"]


def paper_markdown(rows: List[Dict[str, Any]], graph: Dict[str, Any] = PAPERS100M) -> str:
    headers = ["machines", "layout", "inner nodes", "halo nodes", "edges held", "features GB",
               "label+masks GB", "CSC indptr+indices GB", "edge ids GB (CSC + _ID)", "COO GB",
               "node _ID + flags GB", "structure GB", "total GB", "x one machine", "total GB, no cut (lower bound)",
               "train nodes"]
    body = []
    for r in rows:
        eid = r["eid_b"]
        body.append([r["machines"], r["layout"], f"{r['inner_nodes']:,.0f}",
                     f"{r['halo_nodes']:,.0f}" + (f" ({r['halo_per_inner']:.2f}x)" if r["machines"] > 1 else ""),
                     f"{r['edges_held']:,.0f}", f"{r['features_b'] / GB:.1f}", f"{r['other_ndata_b'] / GB:.2f}",
                     f"{r['csc_b'] / GB:.1f}", f"{eid / GB:.1f}", f"{r['coo_b'] / GB:.1f}",
                     f"{r['ids_flags_b'] / GB:.1f}", f"{r['structure_b'] / GB:.1f}", f"{r['total_b'] / GB:.1f}",
                     f"{r['vs_one_machine']:.3f}",
                     f"{r['total_no_cut_b'] / GB:.1f}" if "total_no_cut_b" in r else "",
                     f"{r['train_per_machine']:,.0f}"])
    md = (f"{graph['name']}: {graph['nodes']:,} nodes, {graph['edges']:,} edges (as OGB ships them; with reverse "
          f"edges every per-edge column doubles), {graph['feat_dim']}-d float32 features, "
          f"{graph.get('train', 0):,} train nodes. GB = 1e9 bytes.\n\n")
    md += harness.markdown_table(headers, body)
    sources = sorted({r.get("halo_source") for r in rows if r.get("halo_source")})
    cuts = ", ".join(f"{k} parts {100 * v['cut_fraction']:.0f}%" for k, v in sorted(HALO_MEASURED.items())
                     if v.get("cut_fraction") is not None)
    md += ("\n\nHalo nodes and edges held (inner nodes' in-edges + their out-edges to halo nodes): ratios "
           + ", ".join(sources) + " (1Mx10 in K METIS parts, 1 halo hop; `HALO_MEASURED` in this script; edges "
           f"cut: {cuts}). That graph is random with 8 classes: METIS cuts along the classes up to 8 parts and "
           "through them beyond. papers100M, a citation graph, partitions better, so these columns are "
           "pessimistic; \"no cut\" is the lower bound (inner nodes and their in-edges only). Per machine the "
           "graph server holds all of this once, in shared memory its trainers map (no copy per trainer), CSC "
           "only (DGL's server default); one machine (fork launcher) holds COO (the graph as built) + CSC with "
           "edge ids and every node's data.")
    return md


def model_bytes_one_part(spec: Dict[str, Any]) -> Dict[str, float]:
    """What :func:`paper_rows`'s model says a 1-part DistDGL server holds for the benchmark
    graph (plus the 1-part file's ``_TYPE`` int32 per edge, which the server keeps)."""
    g = {"name": "synthetic", "nodes": spec["num_nodes"], "edges": spec["num_nodes"] * spec["avg_degree"],
         "feat_dim": spec["feat_dim"]}
    rows = paper_rows(g, machines=(1,), halo={1: {"halo_per_inner": 0.0, "edges_per_inner_edge": 1.0}})
    one, part = rows[0], rows[1]
    return {"one_machine_mb": one["total_b"] / MB, "server_mb": (part["total_b"] + 4.0 * g["edges"]) / MB}


def halo_stats(summary: Any) -> Dict[str, Any]:
    """Halo nodes per inner node, edges a part stores per inner edge, cut fraction."""
    import dgl

    inner = sum(r.inner_nodes for r in summary.rows)
    halo = sum(r.halo_nodes for r in summary.rows)
    inner_edges = sum(r.inner_edges for r in summary.rows)
    held = 0
    for i in range(summary.parts):
        (pg,), _ = dgl.load_graphs(str(Path(summary.config).parent / f"part{i}" / "graph.dgl"))
        held += pg.num_edges()
        del pg
    return {"parts": summary.parts, "halo_per_inner": halo / inner, "edges_per_inner_edge": held / inner_edges,
            "cut_fraction": summary.cut_fraction, "inner_nodes": [r.inner_nodes for r in summary.rows],
            "halo_nodes": [r.halo_nodes for r in summary.rows], "inner_edges": [r.inner_edges for r in summary.rows],
            "seconds": summary.seconds}


def measure_halo(spec: Dict[str, Any], parts: Sequence[int], out_dir: Path) -> Dict[str, Any]:
    from graphtrainer.distdgl.partition import partition_graph

    graph = workload.build_graph(spec)
    out: Dict[str, Any] = {"graph": spec, "parts": {}}
    for k in parts:
        with tempfile.TemporaryDirectory(prefix="distgraph-halo-") as tmp:
            summary = partition_graph(graph, "syn", k, tmp)
            out["parts"][k] = halo_stats(summary)
            print(f"[{NAME}] {k} parts: " + json.dumps({x: out["parts"][k][x] for x in
                  ("halo_per_inner", "edges_per_inner_edge", "cut_fraction", "seconds")}), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "halo.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"[{NAME}] wrote {out_dir / 'halo.json'}")
    return out

