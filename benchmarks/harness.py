"""The benchmark harness: common arguments, interleaved rounds, worker processes, the environment
record, results files (JSON + Markdown + PNG) and the README's table, generated from the newest files:

    python benchmarks/harness.py report [--check]   # rewrite README.md's section (--check: exit 1 if stale)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("DGLBACKEND", "pytorch")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# graphtrainer from this checkout; spawned children inherit the path
sys.path[:0] = [p for p in (str(ROOT), str(HERE)) if p not in sys.path]
RESULTS = HERE / "results"


# ---- numbers and tables ------------------------------------------------------------
def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def fmt_ratio(x: Optional[float]) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


# ---- the environment record --------------------------------------------------------
def available_cores() -> int:
    """Cores this process may run on (its affinity mask), as the trainer counts them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _busy_cpu_s() -> float:
    """CPU seconds of every process on the machine since boot (user nice system irq softirq steal)."""
    with open("/proc/stat", encoding="ascii") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process, its live descendants and its reaped children."""
    import psutil

    t = (me := psutil.Process()).cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


#: Above this many cores of other work during a run, its timings are marked as noisy.
NOISY_CORES = 0.25


def noise_note(other_cores: float) -> str:
    return "" if other_cores <= NOISY_CORES else f" (noisy: {other_cores:.2f} cores busy elsewhere)"


class LoadMeter:
    """``other_cores``: CPU time used *outside* this process tree during the block, per second
    of wall time (0 = quiet machine): timings taken well above 0 are skewed by other work."""

    def __enter__(self) -> "LoadMeter":
        self._wall, self._busy, self._own = time.monotonic(), _busy_cpu_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        other = (_busy_cpu_s() - self._busy) - (_own_cpu_s() - self._own)
        self.other_cores = round(max(0.0, other) / max(time.monotonic() - self._wall, 1e-6), 2)


def _run_text(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> Dict[str, Any]:
    """Cores, memory, CPU and GPU model, and the load now."""
    import psutil

    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    # the GPU from nvidia-smi, not torch: initialising CUDA here would forbid forking ranks later
    gpu = _run_text(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
    return {"cpus": os.cpu_count(), "cores_available": available_cores(), "cpu_model": model,
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "gpu": gpu[0] if gpu else None,
            "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "available_gib_start": round(psutil.virtual_memory().available / 2**30, 1)}


def versions() -> Dict[str, Any]:
    """torch, dgl (when it loads), the stack's name and this checkout's commit."""
    import torch

    out: Dict[str, Any] = {"torch": torch.__version__}
    with contextlib.suppress(Exception):  # the GPU machine has no DGL
        import dgl

        out["dgl"] = dgl.__version__
    return dict(out, stack=os.environ.get("GRAPHTRAINER_STACK"),
                commit=_run_text(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]) or None)


# ---- command line ------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        ns = super().parse_args(argv, namespace)
        if getattr(ns, "worker", None):  # a run_worker child: its result to the config's result_file, then exit
            cfg = json.loads(ns.worker)
            Path(cfg["result_file"]).write_text(json.dumps(ns.worker_fn(cfg)), encoding="utf-8")
            raise SystemExit(0)
        given = {self._option_string_actions[a.split("=")[0]].dest for a in argv
                 if a.split("=")[0] in self._option_string_actions}
        for key, value in (ns.tiny_overrides.items() if ns.tiny else ()):
            if hasattr(ns, key) and key not in given:
                setattr(ns, key, value)
        if getattr(ns, "out", "unset") is None:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
            ns.out = Path("bench_out") / ns.bench_name if ns.tiny else RESULTS / ns.bench_name / stamp
        ns.started, ns.loadavg_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
        if ns.loadavg_start[0] > 0.25 * available_cores():
            print(f"[bench] WARNING: 1-minute load average {ns.loadavg_start[0]} on {available_cores()} cores "
                  "before starting: timings will be noisy; memory figures are unaffected", file=sys.stderr, flush=True)
        return ns


def base_parser(name: str, description: str, rounds: Optional[int] = None, tiny: Optional[Dict[str, Any]] = None,
                worker: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> argparse.ArgumentParser:
    """``--out`` (default ``benchmarks/results/<name>/<date>``; with ``--tiny``: ``bench_out/<name>``),
    ``--tiny`` (alias ``--quick``: a seconds-long smoke configuration: the ``tiny`` values replace
    those of options not given) and, given a default, ``--rounds`` (interleaved A B A B rounds).
    ``worker``: the script is also :func:`run_worker`'s child, where parsing runs ``worker(config)`` and exits.
    The parsed options hold ``started`` (the run's clock, for :func:`report`)."""
    parser = _Parser(description=description.strip().splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: benchmarks/results/{name}/<date>; --tiny: bench_out/{name})")
    parser.add_argument("--tiny", "--quick", dest="tiny", action="store_true",
                        help="a seconds-long configuration (smoke test)")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (default %(default)s)")
    if worker is not None:
        parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.set_defaults(bench_name=name, tiny_overrides=dict(tiny or {}), worker_fn=worker)
    return parser


def subcommands(doc: str, commands: Dict[str, Callable[[List[str]], Any]], argv: Any = None) -> Any:
    """``SCRIPT NAME [its options]``: runs ``commands[NAME]`` on the rest of ``argv``; a missing or
    unknown name lists the choices, each with its docstring's first line, and exits 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(description=doc.splitlines()[0], epilog="NAME --help: its options")
    questions = (f"{name}: {str(f.__doc__).splitlines()[0].rstrip('.')}" for name, f in commands.items())
    top.add_argument("name", choices=list(commands), help="; ".join(questions))
    top.parse_args(argv[:1])
    return commands[argv[0]](argv[1:])


# ---- interleaved rounds ------------------------------------------------------------
def interleave(arms: Dict[str, Callable[[int], Dict[str, Any]]], rounds: int, label: str = "",
               show: Optional[Callable[[Dict[str, Any]], str]] = None, alternate: bool = False
               ) -> Tuple[Dict[str, List[Dict[str, Any]]], List[str]]:
    """Run every arm once per round, A B A B ... (``alternate``: A B B A ...), so drifting machine
    load hits each arm alike; ``arms[name](round)`` runs one. Each result gets ``other_cores``
    (see :class:`LoadMeter`) and the 1-minute load before it; ``show(result)`` is printed."""
    runs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in arms}
    order: List[str] = []
    for rnd in range(rounds):
        for name in (list(arms)[::-1] if alternate and rnd % 2 else list(arms)):
            load = round(os.getloadavg()[0], 2)
            print(f"[bench] {label} round {rnd + 1}/{rounds}: {name} (load {load})", flush=True)
            with LoadMeter() as meter:
                res = arms[name](rnd)
            res["loadavg_1min_before"], res["other_cores"] = load, meter.other_cores
            if show is not None:
                print(f"    {show(res)} (other load {meter.other_cores} cores)", flush=True)
            runs[name].append(res)
            order.append(name)
    return runs, order


def run_process(argv: Sequence[str], label: str, timeout: float = 900.0, env: Optional[Dict[str, str]] = None,
                peak_pss: bool = False) -> Dict[str, Any]:
    """Run a benchmark's worker process (unbuffered, this checkout on its path); ``wall_s``,
    ``other_cores`` and, with ``peak_pss``, the peak total PSS of its tree (sampled every
    0.25 s). On failure or timeout its tree is killed and the error holds its output's tail."""
    import threading

    import psutil

    import probe

    env = dict(env or os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    peak, stop = [0.0], threading.Event()
    with tempfile.TemporaryFile("w+b") as log, LoadMeter() as meter:
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env)

        def sample() -> None:
            while peak_pss and not stop.wait(0.25):
                peak[0] = max(peak[0], probe.tree_memory(proc.pid)["total_pss_mb"])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop.set()
            sampler.join()
            with contextlib.suppress(psutil.NoSuchProcess):  # a tutorial's spawned ranks outlive their parent
                tree = psutil.Process(proc.pid)
                for leftover in tree.children(recursive=True) + [tree]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        leftover.kill()
        wall = time.perf_counter() - started
        if code != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"{label} {'timed out' if code is None else f'failed (exit {code})'}:\n{tail}")
    return {"wall_s": round(wall, 1), "peak_total_pss_mb": round(peak[0], 1), "other_cores": meter.other_cores}


def run_worker(argv: Sequence[str], cfg: Dict[str, Any], label: str, timeout: float = 900.0) -> Dict[str, Any]:
    """Run ``argv --worker CONFIG`` (``cfg`` as JSON, a ``result_file`` added) in a fresh process with
    :func:`run_process`: a script whose :func:`base_parser` was given ``worker``; returns that JSON result."""
    with tempfile.TemporaryDirectory(prefix="gt-bench-worker-") as tmp:
        cfg = dict(cfg, result_file=os.path.join(tmp, "result.json"))
        run_process([*argv, "--worker", json.dumps(cfg)], label, timeout)
        return json.loads(Path(cfg["result_file"]).read_text(encoding="utf-8"))


# ---- results files -----------------------------------------------------------------
def report(args: Any, payload: Dict[str, Any], markdown: str, plot: Optional[Callable[[Any], None]] = None,
           figsize: Sequence[float] = (12, 4.5)) -> Dict[str, Any]:
    """Print ``markdown`` and write ``<name>.json`` (``payload`` with the run's options as ``config``, its
    ``wall_s``, date, machine and versions), ``<name>.md`` and, with ``plot``, ``<name>.png``; returns the JSON."""
    name, out_dir = args.bench_name, Path(args.out)
    print(markdown, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    internal = {"tiny_overrides", "started", "loadavg_start", "bench_name", "worker", "worker_fn"}
    options = {k: v if isinstance(v, (int, float, bool, str, type(None), list, dict)) else str(v)
               for k, v in vars(args).items() if k not in internal}
    payload = {"benchmark": name, "date": now, "versions": versions(), **payload, "config": options,
               "wall_s": round(time.perf_counter() - args.started, 1)}
    m = payload["machine"] = payload.get("machine") or dict(machine_info(), loadavg_start=args.loadavg_start)
    m["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    paths = {ext: out_dir / f"{name}.{ext}" for ext in ("json", "md") + (("png",) if plot else ())}
    paths["json"].write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    paths["md"].write_text(f"<!-- {name}: {m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('ram_gib')} GiB RAM, "
                           f"load average {m.get('loadavg_start')} at start, {m.get('loadavg_end')} at end -->\n"
                           + markdown.rstrip() + "\n", encoding="utf-8")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=tuple(figsize))
        try:
            plot(fig)
            fig.tight_layout()
            fig.savefig(paths["png"], dpi=110)
        finally:
            plt.close(fig)
    print(f"[{name}] wrote {', '.join(str(p) for p in paths.values())}", flush=True)
    return payload


def bar_plot(values: Dict[str, float], ylabel: str, title: str = "") -> Callable[[Any], None]:
    """A ``plot`` for :func:`report`: one bar per arm."""
    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        ax.bar(list(values), list(values.values()))
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    return draw


# ---- the README's table ------------------------------------------------------------
#: Benchmark name -> the one line its newest results file is summarised by.
HEADLINES: Dict[str, Callable[[Dict[str, Any]], str]] = {
    "overhead": lambda d: "; ".join(f"{t['graph']}: graphtrainer / hand-written {t['measured']:.3f}x"
                                    for t in d["targets"]),
    "tutorial_vs_task": lambda d: "; ".join(f"{r['graph']} x{r['world']}: epoch {r['epoch_ratio']:.3f}x, "
                                            f"PSS {r['pss_ratio']:.2f}x" for r in d["results"]),
    "fork_vs_spawn": lambda d: "; ".join([f"{t['what']} {t['measured']:.2f}" for t in d["targets"][:2]] + [
        f"{t['graph']}: {t['what']} {t['measured']:.2f}" for t in d["targets"][2:] if "throughput" in t["what"]]),
    "precision": lambda d: "; ".join(f"{r['graph']}: bf16 / fp32 epoch {r['time_ratio']:.2f}x" for r in d["results"]),
    "gpu": lambda d: f"{d['device']}: " + ", ".join(f"{k} {v['seeds_per_s']:,.0f} seeds/s" for k, v in d["gpu"].items()
                                                    if "seeds_per_s" in v),
    "device_sampling": lambda d: f"{d['device']}: " + "; ".join(
        [f"{g} {k} {v['seeds_per_s']:,.0f} seeds/s" for g, arms in d["training"].items() for k, v in arms.items()]
        + [f"{k}: torch / DGL {r['ms']['floyd'] / r['ms']['dgl']:.2f}x, {r.get('torch_ops')} ops" + "".join(
            f", {w} {v['ms']['torch'] / v['ms']['dgl']:.2f}x" for w, v in r.get("weighted", {}).items())
           for k, r in d["per_batch"].items()]),
    "pyg_gather": lambda d: "kept rows / all rows: CPU ms per batch {:.2f}x to {:.2f}x, x rows {:.2f}x to {:.2f}x".format(
        *(f(v) for v in ([r["ratio"] for r in d["rows"]], [r["rows"]["x_after"] / r["rows"]["x_before"]
                                                            for r in d["rows"]]) for f in (min, max))),
    "pyg_attrs": lambda d: d["headline"],
    "pyg_vs_blocks": lambda d: ", ".join(f"{k} {v:.2f}x" for k, v in d["ratios"].items()) + " epoch time",
    "small_collectives": lambda d: ", ".join(
        f"{k} {v:,.0f} us" for k, v in d["us_per_call"]["2"].items()) + " (2 ranks)",
    "stacks": lambda d: f"newest / pinned epoch time {d['summary']['ratio_newest_over_pinned']:.3f}x",
    "distgraph": lambda d: "DistDGL / fork: " + ", ".join(
        f"{k} {v:.2f}x" for k, v in d["throughput"]["ratios"].items() if k in ("seeds_per_s", "rank_pss_mb")),
    "sparse_embedding": lambda d: "sparse / dense: " + ", ".join(
        f"{k} {v:.2f}x" for k, v in d["ratios_sparse_over_dense"].items()),
    "binned_auroc": lambda d: ", ".join(f"{r['method']} {r['seconds']:.1f} s, AUC {r['auc']:.4f}" for r in d["rows"]),
    "ddp_unused": lambda d: "DDP's unused-parameter warning in: " + ", ".join(
        r["config"] for r in d["rows"] if r["ranks_warning"]),
    "workers": lambda d: ", ".join(f"{r['workers']} workers {median(r['seeds_per_s']):,.0f} seeds/s"
                                   for r in d["runs"]),
    "determinism": lambda d: "on / off, ms per batch: " + ", ".join(f"{k} {v:.2f}x" for k, v in d["ratios"].items()),
    "layerwise": lambda d: ", ".join(f"batch {r['batch_size']} {r['seconds']:.1f} s" for r in d["runs"]),
    "nn": lambda d: ", ".join(f"{k} {v['time_ratio']:.2f}x wall, {v['cpu_ratio']:.2f}x CPU"
                              for k, v in d["arms"].items() if k != d["baseline"]) + f" vs {d['baseline']}",
}
BEGIN, END = "<!-- results:begin (python benchmarks/harness.py report) -->", "<!-- results:end -->"


def results_table(results: Path = RESULTS) -> str:
    """One row per benchmark: its results file with the latest ``date`` (ties: the last path)."""
    best: Dict[str, Tuple[Tuple[str, str], Path, Dict[str, Any]]] = {}
    for name in HEADLINES:
        for path in results.rglob(f"{name}.json"):
            data = json.loads(path.read_text(encoding="utf-8"))
            key = (str(data.get("date", "")), path.relative_to(results).as_posix())
            if name not in best or key > best[name][0]:
                best[name] = (key, path, data)
    rows = []
    for name, (_, path, data) in sorted(best.items()):
        try:
            headline = HEADLINES[name](data)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            headline = f"(not summarised: {type(err).__name__} {err})"
        machine = data.get("machine") or {}
        where = machine.get("gpu") or data.get("device") or (f"{machine['cpus']} CPUs" if "cpus" in machine else "")
        rows.append([name, headline, str(data.get("date", ""))[:10], where,
                     f"`benchmarks/results/{path.relative_to(results).as_posix()}`"])
    return markdown_table(["benchmark", "newest result", "date", "machine", "file"], rows)


def render_readme(text: str, results: Path = RESULTS) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"README has no section between {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n{results_table(results)}\n{END}{tail}"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate benchmarks/README.md's results table.")
    parser.add_argument("command", choices=["report"])
    parser.add_argument("--check", action="store_true", help="exit 1 if the README differs from the results")
    args = parser.parse_args(argv)
    readme = HERE / "README.md"
    old = readme.read_text(encoding="utf-8")
    new = render_readme(old)
    if args.check:
        print(f"README.md is {'up to date' if new == old else 'stale: run python benchmarks/harness.py report'}")
        return int(new != old)
    readme.write_text(new, encoding="utf-8")
    print(results_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
