"""Bad input fails early, with a message naming the problem and the fix, and never hangs.

Seed ids: :class:`~graphtrainer.data.node_loader.NodeLoader` checks them when it is built, before
any sampling (DGL would abort the process from C++). A loader built in the launching
process (e.g. in the task's ``__init__``) therefore raises ``ValueError`` there, before
any rank starts; one built in ``train_dataloader()`` (which runs in each rank) fails on
every rank before its first batch, and ``fit`` raises ``RankFailedError`` carrying the
``ValueError``. DGL's own ``DataLoader`` is checked the same way in each rank.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from graphtrainer import GraphTask, RankFailedError, Trainer
from graphtrainer.data.node_loader import NodeLoader

from conftest import rank_children
from tasks import FullSageTask, RegressionTask, full_sampler, make_graph
from launch_env import launchers

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules


# ---- Trainer arguments ----------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a CUDA device exists: gpus=2 is valid here")
def test_gpus_without_cuda_suggests_num_procs():
    with pytest.raises(ValueError, match=r"gpus=2 but no CUDA device is available: train on CPU processes "
                                         r"with Trainer\(num_procs=2\) instead"):
        Trainer(gpus=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(launcher="bogus"), r"launcher='bogus': choose one of \('auto', 'fork', 'spawn', 'forkserver'\)"),
    (dict(num_procs=0), "num_procs must be at least 1, got 0"),
    (dict(num_procs=-2), "num_procs must be at least 1, got -2"),
    (dict(threads_per_proc=0), "threads_per_proc must be at least 1, got 0"),
    (dict(max_epochs=0), r"max_epochs must be at least 1 \(or set max_steps\)"),
    (dict(max_steps=-2), r"max_steps=-2: give a number of optimizer steps >= 0 \(0 trains none\), or -1 for "
                         "no step limit"),
    (dict(log_every_n_steps=0), "log_every_n_steps must be at least 1, got 0"),
    (dict(check_val_every_n_epoch=0), "check_val_every_n_epoch must be at least 1"),
    (dict(check_val_every_n_epoch=None), r"check_val_every_n_epoch=None .* is not supported: use "
                                         r"check_val_every_n_epoch=1 with val_check_interval=N"),
    (dict(limit_train_batches=0), r"limit_train_batches=0 trains nothing: to only validate, call "
                                  r"trainer.validate\(task\)"),
    (dict(accumulate_grad_batches=0), "accumulate_grad_batches must be at least 1"),
    (dict(gpus=True), "gpus=True: give a number of GPUs or a list of device indices"),
    (dict(gpus=[0, -1]), r"gpus=\[0, -1\]: device indices must be >= 0"),
    (dict(gpus=[0, 1], num_procs=3), r"gpus=\[0, 1\] and num_procs=3 disagree.*drop num_procs"),
])
def test_invalid_trainer_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Trainer(**kwargs)


# ---- the task ----------------------------------------------------------------------------------
class NoTrainingStep(GraphTask):
    def configure_model(self) -> Any:
        return torch.nn.Linear(2, 1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return [torch.zeros(4, 2)]


class NoModel(GraphTask):
    def configure_optimizers(self) -> Any: ...
    def train_dataloader(self) -> Any: ...
    def training_step(self, batch: Any, batch_idx: int) -> Any: ...


@pytest.mark.parametrize("num_procs", [1, 2])
@pytest.mark.parametrize("task, message", [
    (NoTrainingStep(), r"NoTrainingStep does not override training_step\(\), which Trainer.fit needs"),
    (NoModel(), r"NoModel has no model: override configure_model\(\) or assign self.model in __init__"),
])
def test_incomplete_task_fails_before_launch(root_dir, num_procs, task, message):
    trainer = Trainer(num_procs=num_procs, launcher="fork", progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(NotImplementedError, match=message):
        trainer.fit(task)
    assert list(root_dir.iterdir()) == []  # failed before making a run directory or any rank
    assert not rank_children()


class BadLoss(RegressionTask):
    def __init__(self, kind: str):
        super().__init__(scheduler=None)
        self.kind = kind

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> Any:
        loss = super().training_step(idx, batch_idx)
        return {"none": None, "dict": {"logits": loss}, "vector": loss.repeat(2),
                "detached": loss.detach()}[self.kind]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, message", [
    ("none", r"BadLoss.training_step returned None: return the loss tensor, or a dict with key 'loss'"),
    ("dict", r"BadLoss.training_step returned a dict without a loss"),
    ("vector", r"BadLoss.training_step must return a scalar loss tensor"),
    ("detached", r"BadLoss.training_step returned a loss that does not require grad"),
])
def test_training_step_without_a_loss_names_the_hook(root_dir, kind, message):
    with pytest.raises(ValueError, match=message):
        Trainer(progress_bar=False, default_root_dir=root_dir).fit(BadLoss(kind))
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=message) as info:
        Trainer(num_procs=2, launcher="fork", progress_bar=False, default_root_dir=root_dir).fit(BadLoss(kind))
    assert info.value.error_type == "ValueError"
    assert time.monotonic() - start < 30
    assert not rank_children()


@pytest.mark.timeout(60)
def test_a_training_loader_without_a_batch_fails_on_every_rank_before_the_first_epoch(root_dir):
    graph = make_graph()
    task = FullSageTask(graph, 2, ids=torch.arange(3), drop_last=True)  # 1 id per rank, batches of 2
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"the training loader has no batch: 3 ids split between 2 ranks give "
                                              r"each 1, fewer than batch_size=2, and drop_last=True drops the short "
                                              r"batch. Use drop_last=False, a batch_size of at most 1, or fewer "
                                              r"ranks") as info:
        Trainer(num_procs=2, launcher="fork", max_epochs=2, progress_bar=False, default_root_dir=root_dir).fit(task)
    assert info.value.error_type == "ValueError"
    assert time.monotonic() - start < 30
    assert not rank_children()


def test_a_batch_limit_that_leaves_no_batch_fails_before_the_first_epoch(root_dir):
    task = FullSageTask(make_graph(), 32)  # 96 ids: 3 batches, and 5% of them is none
    trainer = Trainer(max_epochs=2, limit_train_batches=0.05, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(ValueError, match=r"no rank has a training batch in epoch 0 \(the training loader's len\(\) "
                                         r"is 0 on every rank; limit_train_batches=0.05\)"):
        trainer.fit(task)
    assert trainer.global_step == 0


# ---- seed ids -----------------------------------------------------------------------------------
@pytest.mark.parametrize("ids, message", [
    (torch.tensor([0, 5, 160]), r"ids must lie in \[0, 160\) for this graph, found min 0 and max 160"),
    (torch.tensor([-1, 3]), r"ids must lie in \[0, 160\) for this graph, found min -1 and max 3"),
    (torch.tensor([1.0, 2.0]), r"dtype torch.float32 is not an integer id type; pass int64 node ids"),
    (torch.tensor([[1, 2]]), r"expected a 1-D tensor of node ids, got shape \(1, 2\)"),
    (torch.tensor([], dtype=torch.int64), "the id set is empty"),
    (torch.zeros(5, dtype=torch.bool), r"a boolean mask must have one entry per node \(160\), got 5"),
    (torch.arange(160) % 2 == 0, None),  # a boolean mask: accepted
    ((torch.arange(160) % 2).to(torch.uint8), r"a uint8 0/1 tensor with one entry per node reads as a mask, but "
                                              r"uint8 is not an id type: pass mask.bool\(\)"),
    (torch.tensor([3, 7], dtype=torch.uint8), r"dtype torch.uint8 is not an integer id type"),
])
def test_node_loader_checks_ids_when_built(ids, message):
    graph = make_graph(num_nodes=160)
    if message is None:
        assert len(NodeLoader(graph, ids, full_sampler(2), 4)) == 20  # 80 seeds, batches of 4
        return
    with pytest.raises(ValueError, match=message):
        NodeLoader(graph, ids, full_sampler(2), 4)
    task = FullSageTask(graph, 4)
    with pytest.raises(ValueError, match=message):  # the task's helper, in this process
        task.node_dataloader(ids, [2, 2], 4)


class LoaderInInit(FullSageTask):
    """Builds its training loader in ``__init__``: in the launching process."""

    def __init__(self, graph: Any, ids: torch.Tensor):
        super().__init__(graph, 4)
        self.loader = self.node_dataloader(ids, full_sampler(2), 4)

    def train_dataloader(self) -> Any:
        return self.loader


class DGLLoaderTask(FullSageTask):
    def train_dataloader(self) -> Any:
        import dgl

        return dgl.dataloading.DataLoader(self.graph, self.ids, full_sampler(2), batch_size=4, use_ddp=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [torch.tensor([3, 400]), torch.tensor([3.0, 4.0])], ids=["out_of_range", "float"])
def test_bad_seed_ids_error_not_abort(root_dir, bad):
    graph = make_graph(num_nodes=160)
    # Built in the parent: ValueError there, before fit can launch anything.
    with pytest.raises(ValueError, match="seed ids: "):
        LoaderInInit(graph, bad)
    # Built in the ranks: every rank raises before sampling; no rank aborts, nothing hangs.
    for task_type, what in ((FullSageTask, "seed ids: "), (DGLLoaderTask, "DataLoader indices: ")):
        start = time.monotonic()
        trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False,
                          default_root_dir=root_dir)
        with pytest.raises(RankFailedError) as info:
            trainer.fit(task_type(graph, 4, ids=bad))
        assert info.value.error_type == "ValueError", str(info.value)
        assert info.value.message.startswith(what)
        assert time.monotonic() - start < 30
        assert not rank_children()


# ---- spawn without a main guard ----------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", launchers("spawn", "forkserver"))
def test_spawn_without_main_guard_says_how_to_fix(tmp_path, launcher):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from graphtrainer import Trainer
        from tasks import RegressionTask

        Trainer(num_procs=2, launcher={launcher!r}, max_epochs=1, progress_bar=False,
                default_root_dir={str(tmp_path / "runs")!r}).fit(RegressionTask())
        print("trained")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=80)
    assert done.returncode == 1
    assert "trained" not in done.stdout
    assert f"RuntimeError: launcher='{launcher}' re-imports" in done.stderr
    assert ("Put the code that builds the trainer and calls fit under `if __name__ == \"__main__\":`, "
            "or use launcher='fork'") in done.stderr
    fit_line = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if ".fit(" in line)
    assert f"{script} in every rank, which would start training again there (line {fit_line})" in done.stderr
