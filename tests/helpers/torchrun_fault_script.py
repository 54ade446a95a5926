"""Run by test_faults_torchrun.py under torchrun (2 ranks): rank 1 misbehaves at step 3 (``how``:
raise, kill, sleep); each rank writes what fit raised to ``OUT/rank<r>.json``, then re-raises.
``python torchrun_fault_script.py HOW OUT [HANG_TIMEOUT]`` (default 5 s); with ``sleep``, rank 1
writes the time into ``OUT/hung_at`` as its hang starts."""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from graphtrainer import Trainer  # noqa: E402

from tasks import FailingTask  # noqa: E402

class StampedFailure(FailingTask):
    def __init__(self, stamp: Path, **kwargs):
        super().__init__(**kwargs)
        self.stamp = str(stamp)

    def training_step(self, idx, batch_idx):
        if self.how == "sleep" and self.rank == self.fail_rank and self.global_step == self.at_step:
            Path(self.stamp).write_text(repr(time.time()))
        return super().training_step(idx, batch_idx)


if __name__ == "__main__":
    how, out = sys.argv[1], Path(sys.argv[2])
    hang_timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 5
    trainer = Trainer(max_epochs=5, progress_bar=False, threads_per_proc=1, logger=False, hang_timeout=hang_timeout,
                      enable_model_summary=False, default_root_dir=out / "runs")
    try:
        trainer.fit(StampedFailure(out / "hung_at", how=how, at_step=3, fail_rank=1))
    except BaseException as err:
        seen = {"type": type(err).__name__, "text": str(err), "rank": getattr(err, "rank", None),
                "error_type": getattr(err, "error_type", None)}
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(seen))
        raise
