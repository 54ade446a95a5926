"""Checkpoint format, atomic writes, exact resume (1 rank, 2 ranks fork, 2 ranks spawn),
resume on another world size, ``ckpt_path`` resolution and bad checkpoints."""
from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path

import pytest
import torch

import graphtrainer
from graphtrainer import Callback, ModelCheckpoint, RankFailedError, Trainer
from graphtrainer.checkpoint.content import FORMAT_VERSION, CheckpointError

from stack import requires_graphbolt
from tasks import RegressionTask, SageTask, make_graph

N_EPOCHS, K_EPOCHS = 4, 2


def _state(task):
    return {k: v.detach().clone() for k, v in task.module.state_dict().items()}


def assert_bit_identical(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def assert_nested_equal(a, b, where="checkpoint"):
    """Equal structure and exactly equal tensors (optimizer / scheduler states)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), where
        for k in a:
            assert_nested_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_nested_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _last_ckpt(dirpath):
    return ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True)


# ---- 2 ranks, fork, DGL sampler with dropout: shared by several tests --------------------
@pytest.fixture(scope="module")
def fork_resume(tmp_path_factory):
    """Uninterrupted 4 epochs; 2 epochs saving last.ckpt; a new trainer resuming to 4."""
    base = tmp_path_factory.mktemp("fork_resume")
    graph = make_graph()

    def trainer(epochs, name):
        return Trainer(num_procs=2, launcher="fork", max_epochs=epochs, seed=3, progress_bar=False,
                       default_root_dir=base / "runs", callbacks=[_last_ckpt(base / name)])

    full_task = SageTask(graph, dropout=0.5)
    full = trainer(N_EPOCHS, "full").fit(full_task)
    part_task = SageTask(graph, dropout=0.5)
    part = trainer(K_EPOCHS, "part").fit(part_task)
    resumed_task = SageTask(graph, dropout=0.5)
    resumed = trainer(N_EPOCHS, "resumed")
    resumed.fit(resumed_task, ckpt_path=str(base / "part" / "last.ckpt"))
    return dict(base=base, graph=graph, full=full, full_task=full_task, part=part, part_task=part_task,
                resumed=resumed, resumed_task=resumed_task)


@pytest.mark.timeout(120)
def test_checkpoint_format_after_two_rank_ddp_fit(fork_resume):
    path = fork_resume["base"] / "part" / "last.ckpt"
    ckpt = _load(path)  # weights_only=True: nothing in it needs code to load
    expected = {"format_version", "graphtrainer", "state_dict", "optimizer_states", "lr_scheduler_states",
                "epoch", "global_step", "callbacks", "hyper_parameters", "world_size", "rng_states"}
    assert expected <= set(ckpt)
    assert ckpt["format_version"] == FORMAT_VERSION
    assert ckpt["graphtrainer"] == graphtrainer.__version__
    # The plain model's keys, although the model ran wrapped in DDP.
    task = fork_resume["part_task"]
    assert sorted(ckpt["state_dict"]) == sorted(task.module.state_dict())
    assert not any(k.startswith("module.") for k in ckpt["state_dict"])
    assert_bit_identical(ckpt["state_dict"], _state(task))
    assert len(ckpt["optimizer_states"]) == 1 and ckpt["optimizer_states"][0]["state"]
    assert len(ckpt["lr_scheduler_states"]) == 1
    assert ckpt["lr_scheduler_states"][0]["last_epoch"] == K_EPOCHS
    assert ckpt["epoch"] == K_EPOCHS - 1 and ckpt["epoch_finished"]  # as in its file name; resumes at K
    assert ckpt["global_step"] == fork_resume["part"].global_step == fork_resume["part"].history[-1]["step"]
    assert ckpt["hyper_parameters"] == task.hparams
    assert list(ckpt["hyper_parameters"]["fanouts"]) == [4, 4]
    assert ckpt["world_size"] == 2
    assert list(ckpt["callbacks"]) == [ModelCheckpoint().state_key]
    assert ckpt["callbacks"][ModelCheckpoint().state_key]["last_model_path"] == str(path)
    rngs = ckpt["rng_states"]
    assert len(rngs) == 2 and all(set(r) >= {"python", "numpy", "torch"} for r in rngs)
    assert not torch.equal(rngs[0]["torch"], rngs[1]["torch"])  # each rank's own generator
    assert not list(path.parent.glob(".*tmp*"))


@pytest.mark.timeout(120)
def test_resume_two_ranks_fork_is_bit_identical(fork_resume):
    full, resumed = fork_resume["full"], fork_resume["resumed"]
    assert_bit_identical(_state(fork_resume["resumed_task"]), _state(fork_resume["full_task"]))
    # The run really continued from epoch 2: it trained epochs 2 and 3 only, with the same
    # step counter, and every reduced metric of those epochs matches the uninterrupted run.
    assert [row["epoch"] for row in resumed.history] == [2, 3]
    assert resumed.history == full.history[K_EPOCHS:]
    assert resumed.global_step == full.global_step and resumed.current_epoch == full.current_epoch == N_EPOCHS
    # ... and must have: the halfway weights differ from the final ones.
    assert not torch.equal(_state(fork_resume["part_task"])["layers.0.fc_self.weight"],
                           _state(fork_resume["full_task"])["layers.0.fc_self.weight"])
    # Optimizer (Adam moments and step counts), scheduler, counters: all as uninterrupted.
    end_full = _load(fork_resume["base"] / "full" / "last.ckpt")
    end_resumed = _load(fork_resume["base"] / "resumed" / "last.ckpt")
    assert_nested_equal(end_resumed["optimizer_states"], end_full["optimizer_states"], "optimizer_states")
    assert_nested_equal(end_resumed["lr_scheduler_states"], end_full["lr_scheduler_states"], "lr_scheduler_states")
    assert end_resumed["epoch"] == end_full["epoch"] == N_EPOCHS - 1
    assert end_resumed["global_step"] == end_full["global_step"]


@pytest.mark.timeout(120)
def test_resume_on_other_world_size_warns_about_rng(fork_resume, root_dir):
    ckpt_path = fork_resume["base"] / "part" / "last.ckpt"
    saved = _load(ckpt_path)
    task = SageTask(fork_resume["graph"], dropout=0.5)
    trainer = Trainer(max_epochs=K_EPOCHS + 1, progress_bar=False, default_root_dir=root_dir, seed=3)
    with pytest.warns(UserWarning, match=r"written by 2 ranks and is resumed on 1.*RNG"):
        trainer.fit(task, ckpt_path=str(ckpt_path))
    assert [row["epoch"] for row in trainer.history] == [K_EPOCHS]
    # One epoch of 96 training nodes in batches of 16 on a single rank: 6 steps.
    assert trainer.global_step == saved["global_step"] + 6
    assert trainer.lr_schedulers[0].scheduler.last_epoch == K_EPOCHS + 1
    assert len(trainer.optimizers[0].state_dict()["state"]) == len(saved["optimizer_states"][0]["state"])


# ---- 1 rank, in process -------------------------------------------------------------------
def _regression_trainer(root, epochs, **kw):
    return Trainer(max_epochs=epochs, seed=5, progress_bar=False, default_root_dir=root, **kw)


def test_resume_one_rank_in_process_is_bit_identical(root_dir, tmp_path):
    full_task = RegressionTask(dropout=0.3)
    full = _regression_trainer(root_dir, N_EPOCHS).fit(full_task)

    part_task = RegressionTask(dropout=0.3)
    part = _regression_trainer(root_dir, K_EPOCHS).fit(part_task)
    path = tmp_path / "k.ckpt"
    part.save_checkpoint(path)
    assert _load(path)["epoch"] == K_EPOCHS and _load(path)["world_size"] == 1

    resumed_task = RegressionTask(dropout=0.3)
    resumed = _regression_trainer(root_dir, N_EPOCHS).fit(resumed_task, ckpt_path=str(path))
    assert_bit_identical(_state(resumed_task), _state(full_task))
    assert [row["epoch"] for row in resumed.history] == [2, 3]
    assert resumed.history == full.history[K_EPOCHS:]
    assert resumed.global_step == full.global_step == N_EPOCHS * 8
    assert resumed.current_epoch == N_EPOCHS
    assert_nested_equal(resumed.optimizers[0].state_dict(), full.optimizers[0].state_dict(), "optimizer")
    assert_nested_equal(resumed.lr_schedulers[0].scheduler.state_dict(),
                        full.lr_schedulers[0].scheduler.state_dict(), "scheduler")
    assert resumed.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** N_EPOCHS)


def test_ckpt_path_last_and_best_resolution(root_dir, tmp_path):
    reference = RegressionTask(dropout=0.3)
    _regression_trainer(root_dir, N_EPOCHS).fit(reference)

    # "last" on the same trainer, continuing the run with a larger max_epochs.
    dirpath = tmp_path / "ckpts"
    ckpt = ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True)
    trainer = _regression_trainer(root_dir, K_EPOCHS, callbacks=[ckpt])
    trainer.fit(RegressionTask(dropout=0.3))
    assert ckpt.last_model_path == str(dirpath / "last.ckpt")
    trainer.config = dataclasses.replace(trainer.config, max_epochs=N_EPOCHS)
    continued = RegressionTask(dropout=0.3)
    trainer.fit(continued, ckpt_path="last")
    assert [row["epoch"] for row in trainer.history] == [2, 3]
    assert_bit_identical(_state(continued), _state(reference))

    # "last" on a brand-new trainer whose ModelCheckpoint writes to the same directory.
    fresh = RegressionTask(dropout=0.3)
    trainer = _regression_trainer(root_dir, N_EPOCHS + 1,
                                  callbacks=[ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True)])
    trainer.fit(fresh, ckpt_path="last")
    assert [row["epoch"] for row in trainer.history] == [N_EPOCHS]

    # "best": the monitored score is best after epoch 1, so fit resumes at epoch 2.
    script = {"score": [0.5, 0.1, 0.3]}
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="score", save_top_k=1)
    first_task = RegressionTask(dropout=0.3, script=script)
    _regression_trainer(root_dir, 3, callbacks=[best]).fit(first_task)
    assert Path(best.best_model_path).name == "epoch=1-step=16.ckpt"
    again = RegressionTask(dropout=0.3, script=script)
    trainer = _regression_trainer(root_dir, 3, callbacks=[best])
    trainer.fit(again, ckpt_path="best")
    assert [row["epoch"] for row in trainer.history] == [2]
    assert trainer.global_step == 24
    assert_bit_identical(_state(again), _state(first_task))


def test_mid_epoch_checkpoint_resumes_at_start_of_that_epoch(root_dir, tmp_path):
    """Documented as approximate: a mid-epoch checkpoint restarts its epoch from batch 0."""
    from graphtrainer import Callback

    path = tmp_path / "mid.ckpt"

    class SaveMidEpoch(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            if trainer.current_epoch == 1 and batch_idx == 2:
                trainer.save_checkpoint(path)

    _regression_trainer(root_dir, 2, callbacks=[SaveMidEpoch()]).fit(RegressionTask())
    ckpt = _load(path)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 8 + 3
    trainer = _regression_trainer(root_dir, 2)
    trainer.fit(RegressionTask(), ckpt_path=str(path))
    assert [row["epoch"] for row in trainer.history] == [1]
    assert trainer.global_step == 11 + 8  # the whole epoch 1 again, counting on from the saved step


# ---- 2 ranks, spawn ------------------------------------------------------------------------
@pytest.mark.slow  # several seconds (subprocesses or spawned ranks)
@pytest.mark.timeout(180)
def test_resume_two_ranks_spawn_is_bit_identical(root_dir, tmp_path):
    # Baseline with fork (cheaper); the same arithmetic runs under spawn.
    full_task = RegressionTask(dropout=0.3)
    full = Trainer(num_procs=2, launcher="fork", max_epochs=3, seed=5, progress_bar=False,
                   default_root_dir=root_dir).fit(full_task)

    def spawn_trainer(epochs, name):
        return Trainer(num_procs=2, launcher="spawn", max_epochs=epochs, seed=5, progress_bar=False,
                       default_root_dir=root_dir, callbacks=[_last_ckpt(tmp_path / name)])

    part = spawn_trainer(1, "part").fit(RegressionTask(dropout=0.3))
    assert part.current_epoch == 1
    resumed_task = RegressionTask(dropout=0.3)
    resumed = spawn_trainer(3, "resumed").fit(resumed_task, ckpt_path=str(tmp_path / "part" / "last.ckpt"))
    assert_bit_identical(_state(resumed_task), _state(full_task))
    assert resumed.history == full.history[1:]
    assert resumed.global_step == full.global_step == 3 * 4
    end = _load(tmp_path / "resumed" / "last.ckpt")
    assert end["world_size"] == 2 and end["epoch"] == 2 and end["epoch_finished"]
    assert end["lr_scheduler_states"][0]["last_epoch"] == 3


# ---- atomic write ----------------------------------------------------------------------------
def test_crash_mid_save_keeps_previous_checkpoint(root_dir, tmp_path, monkeypatch):
    import graphtrainer.checkpoint.content as ckpt_module

    real_save = ckpt_module.torch.save
    calls = []

    def crashing_save(obj, fh, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return real_save(obj, fh, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf)
        fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])  # half a checkpoint, then the crash
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt_module.torch, "save", crashing_save)
    dirpath = tmp_path / "ckpts"
    trainer = _regression_trainer(root_dir, 3, callbacks=[_last_ckpt(dirpath)])
    with pytest.raises(CheckpointError, match="No space left on device while writing .*last.ckpt; "
                                              "earlier checkpoints are intact"):
        trainer.fit(RegressionTask())
    monkeypatch.undo()
    assert len(calls) == 2
    assert sorted(p.name for p in dirpath.iterdir()) == ["last.ckpt"]  # no temporary file left
    ckpt = _load(dirpath / "last.ckpt")
    assert ckpt["epoch"] == 0 and ckpt["global_step"] == 8  # the epoch-0 checkpoint, intact


# ---- bad input ----------------------------------------------------------------------------
@pytest.fixture
def good_ckpt(root_dir, tmp_path):
    trainer = _regression_trainer(root_dir, 1)
    trainer.fit(RegressionTask())
    path = tmp_path / "good.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_checkpoint_error_names_file(good_ckpt, tmp_path, root_dir, damage):
    data = good_ckpt.read_bytes()
    bad = tmp_path / f"{damage}.ckpt"
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    with pytest.raises(CheckpointError, match=str(bad)):
        _regression_trainer(root_dir, 2).fit(RegressionTask(), ckpt_path=str(bad))
    with pytest.raises(CheckpointError, match=str(bad)):
        _regression_trainer(root_dir, 2).validate(RegressionTask(), ckpt_path=str(bad))
    if damage == "truncated":  # the same error, from a rank, with 2 ranks
        with pytest.raises(RankFailedError, match=f"CheckpointError: checkpoint {bad}"):
            Trainer(num_procs=2, launcher="fork", progress_bar=False,
                    default_root_dir=root_dir).validate(RegressionTask(), ckpt_path=str(bad))


def test_checkpoint_of_other_model_lists_missing_and_unexpected_keys(good_ckpt, root_dir):
    task = SageTask(make_graph())
    with pytest.raises(CheckpointError) as info:
        Trainer(progress_bar=False, default_root_dir=root_dir).validate(task, ckpt_path=str(good_ckpt))
    text = str(info.value)
    assert str(good_ckpt) in text
    assert "missing keys ['layers.0.fc_neigh.weight'" in text
    assert "unexpected keys ['0.bias', '0.weight', '3.bias', '3.weight']" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_procs", [1, 2])
@pytest.mark.parametrize("which", ["best", "last"])
def test_ckpt_path_best_without_model_checkpoint_is_clear_value_error(root_dir, num_procs, which):
    trainer = Trainer(num_procs=num_procs, launcher="fork", progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(ValueError, match=f"ckpt_path='{which}' needs a ModelCheckpoint"):
        trainer.test(RegressionTask(), ckpt_path=which)
    with pytest.raises(ValueError, match=f"ckpt_path='{which}' needs a ModelCheckpoint"):
        trainer.fit(RegressionTask(), ckpt_path=which)


# ---- checkpoint hooks and seeding --------------------------------------------------------
class _HookOrder(Callback):
    def __init__(self, calls):
        self.calls = calls

    def on_save_checkpoint(self, trainer, task, checkpoint):
        self.calls.append("callback.on_save_checkpoint")
        checkpoint["seen_by_callback"] = True

    def on_load_checkpoint(self, trainer, task, checkpoint):
        self.calls.append("callback.on_load_checkpoint")


class _HookOrderTask(RegressionTask):
    calls: list = []

    def on_save_checkpoint(self, checkpoint):
        self.calls.append("task.on_save_checkpoint")
        assert checkpoint["seen_by_callback"]  # the callback ran first

    def on_load_checkpoint(self, checkpoint):
        self.calls.append("task.on_load_checkpoint")


class _SaveAtEpochEnd(Callback):
    def __init__(self, path):
        self.path = path

    def on_train_epoch_end(self, trainer, task):
        trainer.save_checkpoint(self.path)


def test_checkpoint_hooks_run_callbacks_before_the_task(root_dir, tmp_path):
    calls = []
    _HookOrderTask.calls = calls
    path = tmp_path / "c.ckpt"
    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                      callbacks=[_HookOrder(calls), _SaveAtEpochEnd(path)])
    trainer.fit(_HookOrderTask())
    assert calls == ["callback.on_save_checkpoint", "task.on_save_checkpoint"]
    calls.clear()
    Trainer(max_epochs=2, progress_bar=False, default_root_dir=root_dir,
            callbacks=[_HookOrder(calls)]).fit(_HookOrderTask(), ckpt_path=str(path))
    assert calls == ["callback.on_load_checkpoint", "task.on_load_checkpoint"]


@requires_graphbolt
def test_seed_epoch_makes_graphbolt_sampling_repeatable():
    import dgl.graphbolt as gb

    from graphtrainer.loop.seeding import seed_epoch

    g = make_graph(num_nodes=200, avg_degree=12)
    indptr, indices, _ = g.adj_tensors("csc")
    graph = gb.fused_csc_sampling_graph(indptr, indices)
    seeds = torch.arange(50)

    def sample(seed, epoch):
        seed_epoch(seed, 0, epoch)
        return graph.sample_neighbors(seeds, torch.LongTensor([3])).sampled_csc.indices

    first = sample(5, 0)
    assert torch.equal(first, sample(5, 0))
    assert not torch.equal(first, sample(5, 1))  # a new epoch draws new neighbours
