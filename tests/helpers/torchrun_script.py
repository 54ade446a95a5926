"""Run by test_engine_launch.py under torchrun, one process per "node": fits a small task
and writes this rank's final parameters, history and run directory to ``sys.argv[1]``."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from graphtrainer import Trainer  # noqa: E402

from tasks import RegressionTask  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1])
    trainer = Trainer(max_epochs=3, seed=4, progress_bar=False, threads_per_proc=1, default_root_dir=out / "runs")
    task = RegressionTask(scheduler=None)
    trainer.fit(task)
    rank = int(os.environ["RANK"])
    torch.save(task.module.state_dict(), out / f"params_rank{rank}.pt")
    (out / f"result_rank{rank}.json").write_text(json.dumps(
        {"history": trainer.history, "log_dir": str(trainer.log_dir), "world_size": trainer.world_size,
         "threads": torch.get_num_threads()}))
