"""Faults that lose runs: hangs, damaged checkpoints, runs writing into other runs' folders,
"last"/"best" after a crash, non-finite losses, errors that hide their cause, leftovers,
wrongly logged numbers and repeatability. Real processes (gloo on CPU), each test bounded
by a timeout, and no process left behind."""
from __future__ import annotations

import csv
import datetime
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from graphtrainer import CheckpointError, EarlyStopping, ModelCheckpoint, Preempted, RankFailedError, Trainer
from graphtrainer.checkpoint import file as checkpoint_file
from graphtrainer._compat import dgl_2_1_streams as seeding
from graphtrainer.checkpoint.content import read_checkpoint
from graphtrainer.data.node_loader import default_sampler

from conftest import rank_children
from tasks import FailingTask, RegressionTask, SageTask, make_graph

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules


def _trainer(root, procs=2, epochs=3, **kwargs):
    kwargs.setdefault("progress_bar", False)
    return Trainer(num_procs=procs, launcher=kwargs.pop("launcher", "fork"), max_epochs=epochs,
                   default_root_dir=root, **kwargs)


def _files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- hangs ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_hung_rank_is_named_with_its_hook_batch_and_stack(root_dir):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        _trainer(root_dir, hang_timeout=10, epochs=5).fit(FailingTask(how="sleep", at_step=3, fail_rank=1))
    elapsed = time.monotonic() - start
    err = info.value
    assert elapsed < 30, f"the hang took {elapsed:.1f} s to surface"
    assert err.rank == 1 and err.ranks == [1] and err.error_type == "Hang"
    assert "rank 1 in training_step (epoch 0, batch 3)" in err.message
    # Rank 0 waits for it inside DDP's gradient all-reduce and is not blamed.
    assert "Waiting for it: rank 0 waiting in DDP's gradient all-reduce" in err.message
    assert "time.sleep(600)  # the hang the launcher must name" in err.remote_traceback
    assert "in training_step" in err.remote_traceback
    assert not rank_children()


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(60)
def test_process_group_timeout_is_configurable(root_dir):
    # With the launcher's hang check off, the collective timeout ends the run: what applies
    # under torchrun or Slurm, where no launcher watches the ranks.
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        _trainer(root_dir, hang_timeout=None, timeout=4, epochs=5).fit(
            FailingTask(how="sleep", at_step=3, fail_rank=1))
    assert time.monotonic() - start < 40  # the default would wait 10 minutes
    assert info.value.rank == 0 and "timeout" in info.value.message.lower()  # gloo's own words
    assert not rank_children()


def test_hang_and_timeout_options_are_checked():
    with pytest.raises(ValueError, match="hang_timeout=0"):
        Trainer(hang_timeout=0)
    with pytest.raises(ValueError, match="timeout=-1"):
        Trainer(timeout=-1)
    assert Trainer(timeout=7).config.timeout == datetime.timedelta(seconds=7)


# ---- integrity -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity")
    ckpt = ModelCheckpoint(dirpath=root / "ck", save_last=True, save_top_k=0)
    _trainer(root / "runs", procs=1, epochs=1, callbacks=[ckpt]).fit(RegressionTask(hidden=4))
    return root / "ck" / "last.ckpt"


@pytest.mark.slow  # 5 s or more on 2 cores
def test_every_flipped_byte_is_found(saved_ckpt, tmp_path):
    data = saved_ckpt.read_bytes()
    read_checkpoint(saved_ckpt)  # the intact file loads
    bad = tmp_path / "bad.ckpt"
    for pos in range(len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match=f"checkpoint {bad} is damaged") as info:
            checkpoint_file.verify(bad)
        assert "weights_only" not in str(info.value), pos


def test_damaged_checkpoint_stops_resume_with_a_clear_error(saved_ckpt, tmp_path, root_dir):
    data = bytearray(saved_ckpt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor's bytes
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        _trainer(root_dir, procs=1).fit(RegressionTask(hidden=4), ckpt_path=str(bad))
    assert "is damaged" in str(info.value) and "weights_only" not in str(info.value)


def test_foreign_zip_is_checked_by_its_crc(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"state_dict": {"w": torch.full((4096,), 3.0)}}, path)
    data = bytearray(path.read_bytes())
    data[data.index(b"\x00\x00\x40\x40" * 8) + 2] ^= 0x10  # a byte of the tensor (3.0 is 0x40400000)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fails its CRC check"):
        read_checkpoint(path)


def test_unsafe_file_is_refused_without_advice_to_load_it_unsafely(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": datetime.date(2020, 1, 1)}, path)
    with pytest.raises(CheckpointError, match="safe loader refused it") as info:
        read_checkpoint(path)
    assert "weights_only" not in str(info.value)


# ---- run folders ---------------------------------------------------------------------------
def _monitored(**kwargs):
    return ModelCheckpoint(monitor="score", mode="min", filename="{epoch}-{score:.2f}", save_last=True, **kwargs)


@pytest.mark.timeout(120)
def test_resume_writes_only_into_its_own_run_folder(root_dir, tmp_path):
    scores = {"score": [3.0, 2.0, 1.0, 0.5, 0.25]}
    _trainer(root_dir, epochs=2, callbacks=[_monitored()]).fit(RegressionTask(script=scores))
    run_a = root_dir / "version_0"
    before = _files(run_a)
    copy = tmp_path / "kept.ckpt"
    copy.write_bytes((run_a / "checkpoints" / "last.ckpt").read_bytes())
    for source in (run_a / "checkpoints" / "last.ckpt", copy):
        trainer = _trainer(root_dir, epochs=4, callbacks=[_monitored()])
        trainer.fit(RegressionTask(script=scores), ckpt_path=str(source))
        assert _files(run_a) == before  # run A untouched, byte for byte
        own = trainer.log_dir / "checkpoints"
        assert trainer.log_dir != run_a and sorted(p.name for p in own.iterdir()) == [
            "epoch=3-score=0.50.ckpt", "last.ckpt"]
        assert trainer.history[0]["epoch"] == 2  # it did resume


@pytest.mark.timeout(120)
def test_each_fit_is_a_run_of_its_own(root_dir):
    first = {"score": [1.0, 0.5, 0.75]}
    ckpt, stop = _monitored(), EarlyStopping(monitor="score", patience=1, verbose=False)
    trainer = _trainer(root_dir, epochs=3, callbacks=[ckpt, stop])
    trainer.fit(RegressionTask(script=first))
    best_1 = ckpt.best_model_path
    assert "version_0" in best_1 and ckpt.best_model_score == 0.5 and stop.stopped_epoch == 2
    run_1 = _files(root_dir / "version_0")
    worse = {"score": [2.0, 3.0, 4.0]}  # never better than run 1's best, and no improvement
    trainer.fit(RegressionTask(script=worse))
    assert _files(root_dir / "version_0") == run_1
    assert ckpt.best_model_path == str(root_dir / "version_1" / "checkpoints" / "epoch=0-score=2.00.ckpt")
    assert ckpt.best_model_score == 2.0
    assert stop.stopped_epoch == 1  # counters started afresh: patience 1 after epoch 0's best


@pytest.mark.timeout(120)
def test_last_and_best_found_by_a_fresh_trainer(root_dir, capsys):
    scores = {"score": [3.0, 1.0, 2.0, 0.5, 0.4]}
    _trainer(root_dir, epochs=3, callbacks=[_monitored()]).fit(RegressionTask(script=scores))
    capsys.readouterr()
    fresh = _trainer(root_dir, epochs=5, callbacks=[_monitored()])  # as after a crash
    fresh.fit(RegressionTask(script=scores), ckpt_path="last")
    last = root_dir / "version_0" / "checkpoints" / "last.ckpt"
    assert f"ckpt_path='last': using {last}" in capsys.readouterr().out
    assert [row["epoch"] for row in fresh.history] == [3, 4]
    again = _trainer(root_dir, epochs=5, callbacks=[_monitored()])
    metrics = again.test(RegressionTask(script=scores), ckpt_path="best")
    best = root_dir / "version_1" / "checkpoints" / "epoch=4-score=0.40.ckpt"
    assert f"ckpt_path='best': using {best}" in capsys.readouterr().out and "test_loss" in metrics


def test_last_without_any_run_starts_fresh_in_fit_and_says_where_it_looked(root_dir, capsys):
    trainer = _trainer(root_dir, procs=1, epochs=1, callbacks=[ModelCheckpoint(save_last=True)])
    with pytest.raises(ValueError, match=r"no last checkpoint found in .*version_\*/checkpoints"):
        trainer.test(RegressionTask(), ckpt_path="last")
    trainer.fit(RegressionTask(), ckpt_path="last")  # the first start of a run that may be requeued
    assert re.search(r"ckpt_path='last': no last checkpoint found in .*version_\*/checkpoints yet: starting "
                     "from scratch", capsys.readouterr().out)
    assert trainer.global_step == 8


# ---- non-finite values ---------------------------------------------------------------------
def test_first_nonfinite_loss_is_reported_once(root_dir):
    with pytest.warns(RuntimeWarning, match=r"rank 0: the training loss was nan at epoch 0, batch 3, step 3") as rec:
        _trainer(root_dir, procs=1, epochs=3).fit(FailingTask(how="nan", at_step=3, fail_rank=0))
    assert sum("training loss was" in str(w.message) for w in rec) == 1


@pytest.mark.timeout(60)
def test_detect_anomaly_stops_at_the_first_nonfinite_loss(root_dir):
    with pytest.raises(RankFailedError) as info:
        _trainer(root_dir, detect_anomaly=True).fit(FailingTask(how="nan", at_step=3, fail_rank=1))
    assert info.value.rank == 1 and info.value.error_type == "FloatingPointError"
    assert "rank 1: the training loss is nan at epoch 0, batch 3, step 3" in info.value.message
    assert not rank_children()


@pytest.mark.timeout(120)
def test_nonfinite_monitored_value_is_never_best_and_stops_early_stopping(root_dir):
    nan, inf = float("nan"), float("inf")
    scores = {"score": [5.0, nan, inf, 4.0]}
    ckpt = ModelCheckpoint(monitor="score", mode="min", save_top_k=-1, filename="{epoch}")
    _trainer(root_dir, epochs=4, callbacks=[ckpt]).fit(RegressionTask(script=scores))
    assert sorted(p.name for p in (root_dir / "version_0" / "checkpoints").iterdir()) == [
        "epoch=0.ckpt", "epoch=3.ckpt"]
    assert ckpt.best_model_score == 4.0
    stop = EarlyStopping(monitor="score", patience=5, verbose=False)
    trainer = _trainer(root_dir, epochs=4, callbacks=[stop])
    trainer.fit(RegressionTask(script=scores))
    assert stop.stopped_epoch == 1 and len(trainer.history) == 2 and "not finite" in stop.stop_reason


# ---- errors that name their cause ------------------------------------------------------------
def test_full_disk_names_the_cause(tmp_path):
    with open("/dev/full", "r+b", buffering=0) as fh:  # every write fails with ENOSPC
        with pytest.raises(CheckpointError, match="No space left on device while writing x.ckpt; "
                                                  "earlier checkpoints are intact"):
            checkpoint_file.write_verified({"w": torch.zeros(1 << 16)}, fh, "x.ckpt")


class _FileSizeLimited(RegressionTask):
    """Rank 0 may write files of at most 2 kB (``ulimit -f``): checkpoints do not fit."""

    def setup(self, stage):
        if self.rank == 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.timeout(60)
def test_file_size_limit_names_the_cause_and_keeps_nothing_partial(root_dir, tmp_path):
    folder = tmp_path / "ck"
    with pytest.raises(RankFailedError) as info:
        _trainer(root_dir, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)]).fit(
            _FileSizeLimited(hidden=64))
    assert info.value.rank == 0 and info.value.error_type == "CheckpointError"
    assert info.value.message.startswith("File too large")
    assert "while writing" in info.value.message and "earlier checkpoints are intact" in info.value.message
    assert list(folder.iterdir()) == []
    assert not rank_children()


def test_bad_fanouts_are_refused_before_sampling():
    graph = make_graph()
    with pytest.raises(ValueError, match=r"fanouts=\[\]: give one fanout per GNN layer"):
        default_sampler(graph, [])
    with pytest.raises(ValueError, match="layer 0 has fanout -3"):
        default_sampler(graph, [-3, 5])


@pytest.mark.timeout(60)
def test_negative_fanout_in_a_rank_is_an_error_not_an_abort(root_dir):
    with pytest.raises(RankFailedError) as info:
        _trainer(root_dir).fit(SageTask(make_graph(), fanouts=(-3, 5)))
    assert info.value.error_type == "ValueError" and "fanout -3" in info.value.message


@pytest.mark.timeout(60)
def test_unpicklable_attribute_under_spawn_is_named(root_dir):
    task = RegressionTask()
    task.lock = threading.Lock()
    with pytest.raises(RuntimeError, match=r"task\.lock \(lock\) cannot be pickled.*launcher='fork'"):
        _trainer(root_dir, launcher="spawn").fit(task)
    assert not rank_children()


class _VectorLoss(RegressionTask):
    def training_step(self, idx, batch_idx):
        return (self.model(self.x[idx]) - self.y[idx]) ** 2


def test_non_scalar_loss_error_gives_the_shape(root_dir):
    with pytest.raises(ValueError, match=r"got one of shape \(8, 1\): reduce it"):
        _trainer(root_dir, procs=1).fit(_VectorLoss())


def test_directory_as_ckpt_path_is_named(root_dir, tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        _trainer(root_dir, procs=1).fit(RegressionTask(), ckpt_path=str(tmp_path))


# ---- nothing left behind -------------------------------------------------------------------
def test_partial_files_of_dead_writers_are_removed(root_dir, tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = checkpoint_file._host()
    stale = folder / f".last.ckpt.tmp-{host}-{dead.pid}"
    live = folder / f".last.ckpt.tmp-{host}-{os.getppid()}"  # a writer that still runs
    stale.write_bytes(b"partial")
    live.write_bytes(b"partial")
    _trainer(root_dir, procs=1, epochs=1, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)]).fit(
        RegressionTask())
    assert not stale.exists() and live.exists()


class _BigCheckpoint(RegressionTask):
    """Rank 0 writes its pid to ``pid_file`` and ~200 MB checkpoints (slow enough to signal)."""

    def __init__(self, pid_file: str):
        super().__init__()
        self.pid_file = pid_file

    def setup(self, stage):
        if self.rank == 0:
            Path(self.pid_file).write_text(str(os.getpid()))

    def on_save_checkpoint(self, checkpoint):
        checkpoint["ballast"] = torch.ones(50_000_000)


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_save_leaves_no_partial_file(root_dir, tmp_path, sig, terminal_sigint):
    # terminal_sigint: rank 0 takes SIGINT as under a terminal even in a background job's session
    folder, pid_file = tmp_path / "ck", tmp_path / "rank0.pid"
    trainer = _trainer(root_dir, epochs=50, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)])
    outcome = {}

    def run():
        try:
            trainer.fit(_BigCheckpoint(str(pid_file)))
        except BaseException as err:  # noqa: BLE001
            outcome["error"] = err

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 90
    while not list(folder.glob(".*.tmp-*")) and time.monotonic() < deadline and runner.is_alive():
        time.sleep(0.005)
    assert list(folder.glob(".*.tmp-*")), "no save in progress was seen"
    os.kill(int(pid_file.read_text()), sig)
    runner.join(60)
    if sig == signal.SIGTERM:  # a stop request: the save finishes, the ranks stop at the next batch
        assert isinstance(outcome.get("error"), Preempted), outcome
    else:
        assert isinstance(outcome.get("error"), RankFailedError) and outcome["error"].rank == 0
    assert not list(folder.glob(".*.tmp-*"))
    assert not rank_children()


@pytest.mark.timeout(120)
def test_failed_fits_hold_no_file_descriptors(root_dir):
    me = psutil.Process()
    _fail = lambda: _trainer(root_dir).fit(FailingTask(how="raise", at_step=1))  # noqa: E731
    with pytest.raises(RankFailedError):
        _fail()  # warm-up: imports and caches open what they keep
    before = me.num_fds()
    for _ in range(3):
        with pytest.raises(RankFailedError):
            _fail()
    assert me.num_fds() == before


class _FailsAtSetup(RegressionTask):
    def configure_optimizers(self):
        raise RuntimeError("no optimizer today")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procs", [1, 2])
def test_fit_failing_before_training_leaves_no_run_folder(root_dir, procs):
    for _ in range(2):
        with pytest.raises((RuntimeError, RankFailedError), match="no optimizer today"):
            _trainer(root_dir, procs=procs).fit(_FailsAtSetup())
    assert list(root_dir.iterdir()) == []
    # A run that trained keeps its folder even when it fails later.
    with pytest.raises((RuntimeError, RankFailedError)):
        _trainer(root_dir, procs=procs, epochs=3).fit(RegressionTask(fail_at_epoch=1, fail_rank=0))
    assert [p.name for p in root_dir.iterdir()] == ["version_0"]


# ---- numbers written rightly ---------------------------------------------------------------
@pytest.mark.timeout(60)
def test_step_rows_hold_only_that_steps_training_values(root_dir):
    trainer = _trainer(root_dir, epochs=3, log_every_n_steps=1)
    trainer.fit(RegressionTask())
    with open(trainer.log_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    step_rows = [r for r in rows if r.get("train_loss_step")]
    assert len(step_rows) == 3 * 4  # 64 samples, 2 ranks, batches of 8
    assert all(not r["val_loss"] and not r["train_loss"] for r in step_rows)
    assert not any(k.startswith("val_") and k.endswith("_step") for k in rows[0])


# ---- repeatability ---------------------------------------------------------------------------
_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from graphtrainer import Trainer
from tasks import SageTask, make_graph
import dgl
if sys.argv[1] == "dgl.seed":
    dgl.seed(123)
elif sys.argv[1] == "fit first":
    Trainer(num_procs=1, max_epochs=1, progress_bar=False, logger=False).fit(SageTask(make_graph()))
if __name__ == "__main__":
    t = Trainer(num_procs=2, launcher="fork", max_epochs=2, seed=3, progress_bar=False, logger=False)
    t.fit(SageTask(make_graph()))
    print("LOSSES", [r["train_loss"] for r in t.history])
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_results_do_not_depend_on_what_the_driver_did_before(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(tests=str(TESTS)))
    losses = {}
    for history in ("nothing", "dgl.seed", "fit first"):
        out = subprocess.run([sys.executable, str(script), history], cwd=tmp_path, capture_output=True,
                             text=True, timeout=200)
        assert out.returncode == 0, out.stderr
        losses[history] = [line for line in out.stdout.splitlines() if line.startswith("LOSSES")]
    assert losses["nothing"] and losses["nothing"] == losses["dgl.seed"] == losses["fit first"]


def test_dgl_stream_is_told_apart_per_thread():
    import dgl  # noqa: F401  (graphtrainer was imported first: the main thread holds stream 0)

    assert seeding.dgl_stream() == seeding.EXPECTED_DGL_STREAM
    seen = []
    worker = threading.Thread(target=lambda: seen.append(seeding.dgl_stream()))
    worker.start()
    worker.join()
    assert seen[0] is not None and seen[0] != seeding.EXPECTED_DGL_STREAM


@pytest.mark.parametrize("change", ["cut 1", "cut 40", "cut 85", "append 1", "append 100", "append 70000"])
def test_a_checkpoint_cut_short_or_extended_is_refused(saved_ckpt, tmp_path, change):
    how, count = change.split()
    data = saved_ckpt.read_bytes()
    changed = data[:-int(count)] if how == "cut" else data + b"\0" * int(count)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(changed)
    with pytest.raises(CheckpointError, match=f"checkpoint {bad} is damaged"):
        read_checkpoint(bad)


class _NoTrainLoader(RegressionTask):
    def train_dataloader(self):
        return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procs", [1, 2])
def test_train_dataloader_returning_none_names_the_hook(root_dir, procs):
    with pytest.raises((TypeError, RankFailedError), match=r"_NoTrainLoader.train_dataloader\(\) returned None"):
        _trainer(root_dir, procs=procs).fit(_NoTrainLoader())
    assert not rank_children()
