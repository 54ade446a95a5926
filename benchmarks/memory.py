"""Memory of a process tree (PSS/USS from ``/proc/<pid>/smaps_rollup``) and the estimate of a
planned run's peak, to refuse sizes the machine cannot hold before building anything."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

MB = 1024 * 1024


def smaps_rollup(pid: int) -> Dict[str, float]:
    """``pss``, ``uss`` (private clean + dirty) and ``rss`` of one process, in MB."""
    fields: Dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {"pss_mb": fields.get("Pss", 0) / 1024, "uss_mb": uss / 1024, "rss_mb": fields.get("Rss", 0) / 1024}


def tree_memory(root_pid: Optional[int] = None) -> Dict[str, Any]:
    """PSS/USS of ``root_pid`` (default: this process) and all its live descendants.

    ``total_pss_mb`` is the sum of PSS over the tree: shared pages (copy-on-write pages of
    forked ranks, shared-memory segments) are counted once in total, split between the
    processes that map them.
    """
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    rows = []
    for proc in procs:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            mem = smaps_rollup(proc.pid)
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        role = "parent" if proc.pid == root.pid else "child"
        rows.append({"pid": proc.pid, "role": role, "cmd": cmd[:120], **{k: round(v, 1) for k, v in mem.items()}})
    return {
        "total_pss_mb": round(sum(r["pss_mb"] for r in rows), 1),
        "parent_pss_mb": round(sum(r["pss_mb"] for r in rows if r["role"] == "parent"), 1),
        "processes": rows,
    }


PROCESS_BASE_MB = 450.0  # python + torch + dgl + gloo of one rank, measured ~350-450 MB RSS


def graph_bytes(num_nodes: int, num_edges: int, feat_dim: int, formats: bool = True) -> Dict[str, float]:
    """Bytes of a DGL graph with float32 ``feat``, int64 ``label`` and three bool masks.

    COO is 16 B/edge; CSR and CSC each 8 B/node + 16 B/edge (indices and edge ids). With
    ``formats`` the CSC that sampling reads is counted (graphtrainer builds only that one).
    """
    coo = 16.0 * num_edges
    csx = 8.0 * num_nodes + 16.0 * num_edges
    ndata = num_nodes * (4.0 * feat_dim + 8 + 3)
    return {"coo": coo, "csx": csx, "ndata": ndata, "total": coo + ndata + (csx if formats else 0.0)}


def estimate_mb(num_nodes: int, num_edges: int, feat_dim: int, launcher: str, world: int) -> float:
    """Peak memory (MB) of one benchmark run; generous on purpose (at 250k and 1M nodes it
    was 10-80% above the measured peaks)."""
    g = graph_bytes(num_nodes, num_edges, feat_dim)
    graph = g["total"] / MB
    build = 3 * g["coo"] / MB  # random endpoints, dedup/sort temporaries while building
    if world == 1 or launcher in ("single",):
        return PROCESS_BASE_MB + graph + build
    procs = PROCESS_BASE_MB * (world + 1)
    if launcher == "gt-fork":
        return procs + graph + build
    if launcher in ("gt-spawn", "gt-forkserver"):
        # moved to shared memory in place, one array at a time (its private copy lives until
        # the array is moved)
        return procs + graph + g["csx"] / MB + build
    if launcher == "naive-spawn":
        # parent: graph + pickled bytes; each rank its copy; while the parent sends to one
        # rank, about one more holds received bytes next to the copy it unpickles
        return procs + (3 + world) * graph + build
    raise ValueError(launcher)


def machine_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().total / MB


def refuse_if_too_big(plans: List[Dict[str, Any]], limit_fraction: float = 0.9,
                      limit_mb: Optional[float] = None, skip: bool = False) -> List[Dict[str, Any]]:
    """The planned runs that fit: below ``limit_fraction`` of the machine's memory (and
    ``limit_mb`` when given). With ``skip``, runs that do not fit are left out (and listed);
    otherwise, or when none fits, exit with the estimate of each."""
    total = machine_memory_mb()
    limit = min(limit_fraction * total, limit_mb or float("inf"))
    too_big = [p for p in plans if p["estimate_mb"] > limit]
    if too_big and skip and len(too_big) < len(plans):
        for p in too_big:
            print(f"skipping {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB, over the "
                  f"{limit / 1024:.1f} GiB limit", flush=True)
        return [p for p in plans if p["estimate_mb"] <= limit]
    if too_big:
        lines = [f"  {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB" for p in too_big]
        raise SystemExit(
            f"refusing: {len(too_big)} planned run(s) need more memory than this machine has "
            f"({total / 1024:.1f} GiB, {int(limit_fraction * 100)}% usable):\n" + "\n".join(lines)
            + "\nUse smaller --sizes, fewer ranks, or drop naive-spawn.")
    return plans
