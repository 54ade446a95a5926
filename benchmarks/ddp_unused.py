"""DDP's "did not find any unused parameters" warning with HeteroSAGE: when it appears, what
the alternatives do, and what each costs per step. 2 ranks (fork, gloo).

    python benchmarks/ddp_unused.py

Each configuration runs in a fresh interpreter (DDP warns on stderr): finished or not, the
error's first line, ranks that warned, median step time after 2 warm-up steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import harness  # noqa: F401  (graphtrainer from this checkout)

WARNING = "did not find any unused parameters"

#: name -> (seed types, Trainer keyword arguments)
CONFIGS: Dict[str, Any] = {
    "paper+word seeds, find_unused=False": (["paper", "word"], {}),
    "paper+word seeds, find_unused=True": (["paper", "word"], {"find_unused_parameters": True}),
    "paper+word seeds, static_graph=True": (["paper", "word"], {"ddp_kwargs": {"static_graph": True}}),
    "paper seeds, find_unused=False": (["paper"], {}),
    "paper seeds, find_unused=True": (["paper"], {"find_unused_parameters": True}),
    "paper seeds, static_graph=True": (["paper"], {"ddp_kwargs": {"static_graph": True}}),
}


def child(name: str, out: str, steps: int) -> None:
    """One configuration: fit, then write the step times (rank 0) as JSON to ``out``."""
    import torch
    import torch.nn.functional as F

    from graphtrainer import Callback, GraphTask, Trainer
    from graphtrainer.datasets import synthetic_hetero
    from graphtrainer.models import HeteroSAGE

    types, kwargs = CONFIGS[name]

    class Times(Callback):
        def __init__(self) -> None:
            self.t, self.times = 0.0, []

        def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
            self.t = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            now = time.perf_counter()
            self.times.append(now - self.t)
            self.t = now

        def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
            if trainer.rank == 0:
                Path(out).write_text(json.dumps(self.times))

    class Task(GraphTask):
        def __init__(self) -> None:
            super().__init__()
            self.graph = synthetic_hetero(20000, 4000, avg_degree=5, words_per_paper=3, feat_dim=16, num_classes=4)
            self.graph.nodes["word"].data["label"] = torch.arange(4000) % 4
            self.ids = {nt: torch.arange(self.graph.num_nodes(nt)) for nt in types}

        def configure_model(self) -> Any:
            g = self.graph
            return HeteroSAGE(g.canonical_etypes, {nt: g.num_nodes(nt) for nt in g.ntypes}, {"paper": 16}, 16, 4,
                              dropout=0.0, embed_dim=16)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.model.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            return self.node_dataloader(self.ids, [5, 5], 256)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            _, out_nodes, blocks = batch
            out = self.model(blocks, {"paper": blocks[0].srcdata["feat"]["paper"]})
            seeds = [nt for nt in out_nodes if out_nodes[nt].numel()]
            logits = torch.cat([out[nt] for nt in seeds])
            labels = torch.cat([blocks[-1].dstdata["label"][nt] for nt in seeds])
            return F.cross_entropy(logits, labels)

    Trainer(num_procs=2, launcher="fork", max_epochs=1, limit_train_batches=steps, logger=False,
            progress_bar=False, enable_model_summary=False, callbacks=[Times()], **kwargs).fit(Task())


def run(name: str, out: Path, steps: int) -> Dict[str, Any]:
    times_file = out / (name.replace(" ", "_").replace(",", "").replace("=", "-").replace("+", "_") + ".json")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--times", str(times_file),
                           "--steps", str(steps)], capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line and "Warning" not in line]
    times = json.loads(times_file.read_text()) if proc.returncode == 0 and times_file.exists() else []
    return {"config": name, "finished": proc.returncode == 0, "error": errors[-1][:300] if errors else "",
            "ranks_warning": proc.stderr.count(WARNING), "wall_s": time.perf_counter() - start,
            "median_step_s": statistics.median(times[2:]) if len(times) > 2 else None}


def main(argv: Any = None) -> None:
    parser = harness.base_parser("ddp_unused", __doc__)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--times", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.times, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run(name, args.out, args.steps) for name in CONFIGS]
    md = harness.markdown_table(
        ["configuration", "finished", "ranks printing the warning", "median step (s)", "error"],
        [[r["config"], r["finished"], r["ranks_warning"], f"{r['median_step_s']:.4f}" if r["median_step_s"] else "-",
          r["error"]] for r in rows])
    harness.write_outputs(args.out, "ddp_unused", {"steps": args.steps, "rows": rows}, md)
    print(md)


if __name__ == "__main__":
    main()
