"""Benchmark output and command line: Markdown tables, the JSON + Markdown + PNG files,
small number formats, the common arguments."""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, payload: Dict[str, Any], markdown: str,
                  plot: Callable[[Any], None], figsize: Sequence[float] = (12, 4.5)) -> Dict[str, Path]:
    """``<name>.json`` (payload plus machine load at the end), ``<name>.md``, ``<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload.setdefault("machine", {})["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md", "png": out_dir / f"{name}.png"}
    paths["json"].write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    m = payload["machine"]
    header = (f"<!-- {name}: {m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('ram_gib')} GiB RAM, load average "
              f"{m.get('loadavg_start')} at start, {m.get('loadavg_end')} at end -->\n")
    paths["md"].write_text(header + markdown.rstrip() + "\n", encoding="utf-8")
    fig = plt.figure(figsize=tuple(figsize))
    try:
        plot(fig)
        fig.tight_layout()
        fig.savefig(paths["png"], dpi=110)
    finally:
        plt.close(fig)
    return paths


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path("bench_out") / name, help="output folder (default: %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long configuration (smoke test)")
    return parser


def fmt_ratio(x: Optional[float]) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"
