"""Run by test_faults_torchrun.py under torchrun (2 ranks): rank 1 misbehaves at step 3 (``how``:
raise, kill, sleep); each rank writes what fit raised to ``OUT/rank<r>.json``, then re-raises."""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from graphtrainer import Trainer  # noqa: E402

from tasks import FailingTask  # noqa: E402

if __name__ == "__main__":
    how, out = sys.argv[1], Path(sys.argv[2])
    trainer = Trainer(max_epochs=5, progress_bar=False, threads_per_proc=1, logger=False, hang_timeout=5,
                      enable_model_summary=False, default_root_dir=out / "runs")
    try:
        trainer.fit(FailingTask(how=how, at_step=3, fail_rank=1))
    except BaseException as err:
        seen = {"type": type(err).__name__, "text": str(err), "rank": getattr(err, "rank", None),
                "error_type": getattr(err, "error_type", None)}
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(seen))
        raise
