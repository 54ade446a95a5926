"""Run by test_preemption.py under ``torchrun --max-restarts 2`` (one restart is needed): fits
with ckpt_path="last" (one command line for the first start and every restart). With ``kill`` as
second argument, rank 1 SIGKILLs itself at the start of epoch 2 of the first attempt; the agent
restarts the group, which resumes from last.ckpt. Rank 0 writes the final parameters and
optimizer state to ``OUT/final.pt``."""
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from graphtrainer import ModelCheckpoint, Trainer  # noqa: E402

from tasks import RegressionTask  # noqa: E402


class KilledOnce(RegressionTask):
    def __init__(self, kill: bool):
        super().__init__(dropout=0.3, scheduler="step")
        self.kill = kill

    def on_train_epoch_start(self):
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if self.kill and first_attempt and self.rank == 1 and self.current_epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    trainer = Trainer(max_epochs=4, seed=4, progress_bar=False, threads_per_proc=1, logger=False,
                      enable_model_summary=False, default_root_dir=out / "runs",
                      callbacks=[ModelCheckpoint(dirpath=out / "ck", save_last=True, save_top_k=0)])
    task = KilledOnce(kill=len(sys.argv) > 2 and sys.argv[2] == "kill")
    trainer.fit(task, ckpt_path="last")
    if int(os.environ["RANK"]) == 0:
        torch.save({"params": task.module.state_dict(),
                    "optimizer": [opt.state_dict() for opt in trainer.optimizers]}, out / "final.pt")
