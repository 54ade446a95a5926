"""A fit whose launching process gets a stop signal before any rank exists (or, in the world of one,
while its one rank starts up).

``python early_signal_driver.py LAUNCHER WHERE ROOT``: a fit of :class:`WaitsOnStdin`, 2 ranks
(``LAUNCHER`` fork, spawn or forkserver) or ``inprocess`` (one rank, this process). At ``WHERE`` the
driver prints ``WAITING`` and blocks reading stdin, which the test controls (it signals the driver,
then closes stdin): ``formats`` (the task's ``graph_formats``, read in the launching process while it
builds the graph's formats: the run folder exists, and under forkserver the fork server runs),
``reset`` (a callback's ``reset``, the first thing ``fit`` does) or ``setup`` (the task's ``setup``).
Prints ``RESULT <json>``: ``exit`` (the raised ``SystemExit``'s code, 0 without one), ``error`` (its
type), ``checkpoint`` (``last.ckpt`` when written), ``children`` (this process's children still running
after the fit, multiprocessing's resource tracker aside), ``run_dirs`` (``ROOT/version_*`` left), then
raises what the fit raised, so the process exits with its status.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphtrainer import Callback, ModelCheckpoint, Trainer  # noqa: E402  (before dgl: its workarounds)

import dgl  # noqa: E402
import psutil  # noqa: E402

from tasks import RegressionTask  # noqa: E402


def _wait_on_test() -> None:
    print("WAITING", flush=True)
    sys.stdin.readline()  # until the test closes stdin (a stop signal may end the wait first)


class WaitsOnStdin(RegressionTask):
    """Waits on stdin in the launching process at ``where`` (once)."""

    def __init__(self, where: str):
        super().__init__(scheduler=None)
        self.where, self.launcher_pid = where, os.getpid()
        self.tiny = dgl.graph(([0, 1], [1, 2]))  # a graph whose formats the launching process builds

    @property
    def graph_formats(self):
        if self.where == "formats" and os.getpid() == self.launcher_pid:
            self.where = "waited"
            _wait_on_test()
        return None

    def setup(self, stage):
        if self.where == "setup":
            _wait_on_test()


class WaitsInReset(Callback):
    def reset(self):
        _wait_on_test()


if __name__ == "__main__":
    launcher, where, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    folder = root / "checkpoints"
    callbacks = [ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)]
    if where == "reset":
        callbacks.append(WaitsInReset())
    procs = dict(num_procs=1) if launcher == "inprocess" else dict(num_procs=2, launcher=launcher)
    trainer = Trainer(**procs, max_epochs=1, seed=3, progress_bar=False, logger=False, enable_model_summary=False,
                      default_root_dir=str(root), callbacks=callbacks)
    raised = None
    try:
        trainer.fit(WaitsOnStdin(where))
    except SystemExit as stop:
        raised = stop
    children = [" ".join(p.cmdline()[-2:]) for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    last = folder / "last.ckpt"
    print("RESULT " + json.dumps({
        "exit": raised.code if raised is not None else 0, "error": type(raised).__name__ if raised else None,
        "checkpoint": str(last) if last.exists() else None, "children": children,
        "run_dirs": sorted(p.name for p in root.glob("version_*"))}), flush=True)
    if raised is not None:
        raise raised
