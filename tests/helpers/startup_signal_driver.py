"""A fit whose launching process gets SIGTERM (a scheduler's stop) while its ranks start up.

``python startup_signal_driver.py LAUNCHER WHEN ROOT [STAGE]``: 2 ranks of :class:`StartupSignal`.
``WHEN`` is ``start``: the launching process signals itself right after starting rank 0's process
(which is then still starting: a spawned one still boots its interpreter), or ``setup``: rank 0's
``setup`` hook signals the launching process and returns only once the signal it passes on has
reached this rank. ``STAGE`` is ``fit`` (the default) or ``test``. Prints ``RESULT <json>``:
``exit`` (the status the fit or test raised, 1 for an error, which goes to stderr; 0 without one), ``checkpoint`` and its ``step``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphtrainer import ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.launch import leftovers, stop_flag  # noqa: E402

from tasks import RegressionTask  # noqa: E402


class StartupSignal(RegressionTask):
    """``when="setup"``: rank 0 signals the launching process from ``setup`` and waits (at most
    60 s) until the signal reached it."""

    def __init__(self, when: str):
        super().__init__(scheduler=None)
        self.when, self.launcher_pid = when, os.getpid()  # (made in the launching process)

    def setup(self, stage):
        if self.when == "setup" and self.rank == 0:
            os.kill(self.launcher_pid, signal.SIGTERM)  # (a forkserver rank's parent is the server)
            deadline = time.monotonic() + 60
            while stop_flag.requested() is None and time.monotonic() < deadline:
                time.sleep(0.01)  # (a rank the signal ends never leaves this loop)


def _signal_after_first_start() -> None:
    forward = leftovers.forward_stop_signals_to

    def forward_then_signal(pid: int) -> None:
        forward(pid)
        if len(leftovers._forward_to) == 1:  # rank 0 just started: this process is told to stop
            os.kill(os.getpid(), signal.SIGTERM)

    leftovers.forward_stop_signals_to = forward_then_signal


if __name__ == "__main__":
    launcher, when, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    stage = sys.argv[4] if len(sys.argv) > 4 else "fit"
    if when == "start":
        _signal_after_first_start()
    folder = root / "checkpoints"
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=2, seed=3, progress_bar=False, logger=False,
                      enable_model_summary=False, default_root_dir=str(root),
                      callbacks=[ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)])
    task = StartupSignal(when)
    status = 0
    try:
        trainer.fit(task) if stage == "fit" else trainer.test(task)
    except SystemExit as stop:
        status = stop.code
    except Exception as err:  # noqa: BLE001 - reported for the test to read
        print(f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
        status = 1
    last = folder / "last.ckpt"
    step = None
    if last.exists():
        import torch

        step = torch.load(last, weights_only=True)["global_step"]
    print("RESULT " + json.dumps({"exit": status, "checkpoint": str(last) if last.exists() else None,
                                  "step": step}), flush=True)
