"""A fit in a process of its own, for tests that signal or kill the launching process.

``python fault_driver.py LAUNCHER READY_DIR [EPOCHS [slow_exit | hang]]``: trains :class:`Marked` on 2
ranks; each rank writes ``READY_DIR/rank<r>.pid`` (its pid) once it trains. ``slow_exit``: each rank
then takes 1.5 s to act on SIGINT (as a rank flushing files on its way out), so the launcher is
still ending them when a second signal comes. ``hang``: rank 1 hangs at step 3, first writing the
time into ``READY_DIR/hung_at`` (``hang_timeout=60``). LAUNCHER "torchrun": this process is
one rank that torchrun started; "distgraph=<partition config>": a DistDGL run on that partition. The test waits for those files, so it signals a run known to be training.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphtrainer import Trainer  # noqa: E402

from tasks import RegressionTask  # noqa: E402


class Marked(RegressionTask):
    """Writes this rank's pid into ``ready_dir`` at its first training step."""

    def __init__(self, ready_dir: str):
        super().__init__(scheduler=None)
        self.ready_dir = ready_dir
        self._marked = False

    def training_step(self, idx, batch_idx):
        _mark(self)
        if os.environ.get("FAULT_DRIVER_HANG") == "1" and self.rank == 1 and self.global_step == 3:
            import time

            (Path(self.ready_dir) / "hung_at").write_text(repr(time.time()))
            time.sleep(600)
        return super().training_step(idx, batch_idx)


def _marked_node_classifier(part_config: str, ready: str):
    from dist_tasks import CORA
    from graphtrainer.examples.node_classification import NodeClassification

    class MarkedNodes(NodeClassification):
        def training_step(self, batch, batch_idx):
            _mark(self)
            return super().training_step(batch, batch_idx)

    task = MarkedNodes(part_config, **CORA)
    task.ready_dir, task._marked = ready, False
    return task


def _slow_sigint(signum, frame):
    import time

    time.sleep(1.5)
    raise KeyboardInterrupt


def _mark(task) -> None:
    if not task._marked:
        task._marked = True
        if os.environ.get("FAULT_DRIVER_SLOW_EXIT") == "1":
            import signal

            signal.signal(signal.SIGINT, _slow_sigint)
        path = Path(task.ready_dir) / f"rank{task.rank}.pid"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.rename(path)


if __name__ == "__main__":
    launcher, ready = sys.argv[1], sys.argv[2]
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
    if sys.argv[4:] == ["slow_exit"]:
        os.environ["FAULT_DRIVER_SLOW_EXIT"] = "1"  # (read by the ranks, spawned ones included)
    procs = {} if launcher == "torchrun" else {"num_procs": 2}
    if sys.argv[4:] == ["hang"]:
        os.environ["FAULT_DRIVER_HANG"] = "1"
        procs["hang_timeout"] = 60
    if launcher.startswith("distgraph="):
        task = _marked_node_classifier(launcher.split("=", 1)[1], ready)
    else:
        procs.update({"launcher": launcher} if launcher != "torchrun" else {})
        task = Marked(ready)
    trainer = Trainer(max_epochs=epochs, progress_bar=False, default_root_dir=str(Path(ready) / "runs"),
                      logger=False, **procs)
    trainer.fit(task)
    print("FINISHED")
