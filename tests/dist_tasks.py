"""Tasks and helpers of the DistDGL tests; also the script one simulated machine runs:

    python tests/dist_tasks.py PART_CONFIG IP_CONFIG OUT_DIR EPOCHS

(fits, tests the best checkpoint, writes the result as JSON to OUT_DIR/machine<rank>.json).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphtrainer import ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402

#: Tutorial 1's Cora settings.
CORA = dict(fanouts=[10, 10], hidden=128, dropout=0.6, lr=0.005, weight_decay=5e-4, batch_size=32,
            eval_batch_size=512)


class SeedRecorder(NodeClassification):
    """Writes, after every training epoch, the seed nodes all ranks trained on (gathered
    on rank 0) to ``<out>/seeds_epoch<e>.pt``. With ``fail`` ("raise" or "kill-server"),
    rank ``fail_rank`` breaks the run at global step 3."""

    def __init__(self, graph: Any, out: str, fail: str = "", fail_rank: int = 1, **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.out, self.fail, self.fail_rank = out, fail, fail_rank
        self._seen: list = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail and self.rank == self.fail_rank and self.global_step == 3:
            if self.fail == "raise":
                raise RuntimeError("trainer fault at step 3")
            if self.fail == "kill-server":
                kill_graph_servers(self.out)
        self._seen.append(batch[1].clone())
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        seen = self.all_gather(torch.cat(self._seen) if self._seen else torch.empty(0, dtype=torch.int64))
        self._seen = []
        if self.rank == 0:
            torch.save(seen, os.path.join(self.out, f"seeds_epoch{self.current_epoch}.pt"))


def kill_graph_servers(out: str) -> None:
    """SIGKILL this run's graph servers (children of the launching process) and note when."""
    import signal
    import time

    import psutil

    driver = psutil.Process(os.getppid())
    servers = [p for p in driver.children() if "graph_servers" in " ".join(p.cmdline())]
    Path(out, "killed_at").write_text(repr(time.time()))
    for proc in servers:
        os.kill(proc.pid, signal.SIGKILL)


def run_machine(part_config: str, ip_config: str, out: str, epochs: int) -> None:
    task = SeedRecorder(part_config, out, **CORA)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", dirpath=os.path.join(out, "checkpoints"))
    trainer = Trainer(num_procs=1, max_epochs=epochs, ip_config=ip_config, progress_bar=False,
                      default_root_dir=os.path.join(out, "runs"), callbacks=[ckpt], hang_timeout=120,
                      enable_model_summary=False)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    rank = trainer.state.rank  # this machine's first rank (one rank per machine here)
    with open(os.path.join(out, f"machine{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world_size": trainer.world_size, "test": result,
                   "last_epoch": trainer.history[-1]}, fh)


if __name__ == "__main__":
    run_machine(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
