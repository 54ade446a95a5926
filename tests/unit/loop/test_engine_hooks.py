"""Hook order: every hook call recorded on every rank of a 2-rank fit (and validate, test,
predict), compared with the order written in ``GraphTask``'s docstring."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List

import pytest
import torch

from graphtrainer import Callback, GraphTask, Trainer

from tasks import IndexBatches, RegressionTask

EPOCHS = 2
# RegressionTask's data: 32 training rows and 24 validation rows; batches of 8 on 2 ranks.
TRAIN_BATCHES = 2  # 16 rows per rank
VAL_BATCHES = 2  # 12 rows per rank: 8 + 4

TASK_HOOKS = ["setup", "teardown", "configure_model", "configure_optimizers", "train_dataloader",
              "val_dataloader", "test_dataloader", "predict_dataloader", "training_step",
              "validation_step", "test_step", "predict_step"] + \
    [name for name in vars(GraphTask) if name.startswith("on_")]
CALLBACK_HOOKS = {name for name in vars(Callback) if name.startswith("on_")} | {"setup", "teardown"}


def _recording(name: str):
    def hook(self, *args: Any):
        self.calls.append(name)
        return getattr(super(HookTask, self), name)(*args)
    return hook


class PredictingRegression(RegressionTask):
    def predict_dataloader(self) -> Any:
        return IndexBatches(self.vx.shape[0], 8, shuffle=False)

    def predict_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(self.vx[idx])


class HookTask(PredictingRegression):
    """Records every hook call; each rank writes its record to ``<out>/<stage>_rank<r>.json``."""

    def __init__(self, out: Path):
        super().__init__(n=32, scheduler=None)
        self.out = str(out)
        self.calls: List[str] = []

    def on_train_epoch_end(self) -> None:
        self.calls.append("on_train_epoch_end")
        self.log("marker", 10.0 * (self.current_epoch + 1))  # monitoring callbacks must see it

    def teardown(self, stage: str) -> None:
        self.calls.append("teardown")
        with open(Path(self.out) / f"{stage}_rank{self.rank}.json", "w") as fh:
            json.dump(self.calls, fh)
        self.calls = []


for _name in TASK_HOOKS:
    if _name not in vars(HookTask):
        setattr(HookTask, _name, _recording(_name))


class HookCallback(Callback):
    """Appends ``<tag>:<hook>`` to the task's record; a monitoring one also notes the metric."""

    def __init__(self, tag: str, monitoring: bool):
        self.tag, self.after_reduction = tag, monitoring

    @property
    def state_key(self) -> str:
        return self.tag


def _callback_recording(name: str):
    def hook(self, trainer: Any, task: Any, *args: Any) -> None:
        task.calls.append(f"{self.tag}:{name}")
        if name == "on_train_epoch_end" and self.after_reduction:
            task.calls.append(f"{self.tag}:marker={trainer.callback_metrics.get('marker')}")
    return hook


for _name in CALLBACK_HOOKS:
    setattr(HookCallback, _name, _callback_recording(_name))


# ---- the docstring, read as a program -------------------------------------------------------
def docstring_blocks() -> List[List[str]]:
    """The literal blocks (after ``::``) of GraphTask's docstring, as lists of lines."""
    lines = GraphTask.__doc__.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].rstrip().endswith("::"):
            block, i = [], i + 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("        ")):
                block.append(lines[i])
                i += 1
            blocks.append([line for line in block if line.strip()])
        else:
            i += 1
    return blocks


def expand(block: List[str], counts: dict) -> List[str]:
    """Hook names in call order: ``name(...)`` lines, ``for each <kind>:`` loops repeated
    ``counts[kind]`` times; comments ignored."""
    def parse(pos: int, indent: int) -> tuple:
        items = []
        while pos < len(block):
            line = block[pos]
            depth = len(line) - len(line.lstrip())
            if depth < indent:
                break
            text = line.split("#")[0].strip()
            pos += 1
            if not text:
                continue
            loop = re.fullmatch(r"for each (.+):", text)
            if loop:
                body, pos = parse(pos, depth + 1)
                items.append((loop.group(1), body))
            else:
                items.append(re.match(r"(\w+)\(", text).group(1))
        return items, pos

    def run(items: list) -> List[str]:
        out: List[str] = []
        for item in items:
            if isinstance(item, str):
                out.append(item)
            else:
                for _ in range(counts[item[0]]):
                    out.extend(run(item[1]))
        return out

    return run(parse(0, 0)[0])


def with_callbacks(hooks: List[str], monitor_marker: bool) -> List[str]:
    """Where the two callbacks' hooks go: ``mon`` (monitoring) and ``cb`` before the task's
    hook, except ``mon:on_train_epoch_end``, which follows the task's."""
    out: List[str] = []
    epoch = 0
    for hook in hooks:
        if hook not in CALLBACK_HOOKS:
            out.append(hook)
        elif hook == "on_train_epoch_end":
            epoch += 1
            out += ["cb:" + hook, hook, "mon:" + hook]
            if monitor_marker:
                out.append(f"mon:marker={10.0 * epoch}")
        else:
            out += ["mon:" + hook, "cb:" + hook, hook]
    return out


def _records(out: Path, stage: str, world: int) -> List[List[str]]:
    return [json.loads((out / f"{stage}_rank{r}.json").read_text()) for r in range(world)]


# ---- tests -----------------------------------------------------------------------------------
def test_docstring_blocks_parse():
    fit_block, eval_block = docstring_blocks()
    fit = expand(fit_block, {"epoch": 1, "training batch": 1, "validation batch": 1, "optimizer": 2})
    assert fit[:7] == ["setup", "configure_model", "configure_optimizers", "train_dataloader",
                       "val_dataloader", "on_fit_start", "on_train_start"]
    assert fit[8:16] == ["on_train_batch_start", "training_step", "on_before_backward", "on_after_backward",
                         "on_before_optimizer_step", "on_before_optimizer_step", "on_before_zero_grad",
                         "on_before_zero_grad"]
    assert fit[-3:] == ["on_train_end", "on_fit_end", "teardown"]
    batch = ["on_validation_batch_start", "validation_step", "on_validation_batch_end"]
    assert expand(eval_block, {"batch": 2}) == [
        "setup", "configure_model", "val_dataloader", "on_validation_epoch_start", *batch, *batch,
        "on_validation_epoch_end", "teardown"]


@pytest.mark.timeout(90)
def test_hook_order_fit_validate_test_predict_two_ranks(root_dir, tmp_path):
    callbacks = [HookCallback("mon", monitoring=True), HookCallback("cb", monitoring=False)]
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=EPOCHS, progress_bar=False,
                      default_root_dir=root_dir, callbacks=callbacks)
    task = HookTask(tmp_path)
    trainer.fit(task)

    fit_block, eval_block = docstring_blocks()
    expected = with_callbacks(expand(fit_block, {"epoch": EPOCHS, "training batch": TRAIN_BATCHES,
                                                 "validation batch": VAL_BATCHES, "optimizer": 1}),
                              monitor_marker=True)
    records = _records(tmp_path, "fit", 2)
    assert records[0] == expected
    assert records[1] == expected
    assert [row["marker"] for row in trainer.history] == [10.0, 20.0]

    # validate / test / predict: a fresh task, so configure_model runs again.
    for stage, run in (("validate", trainer.validate), ("test", trainer.test), ("predict", trainer.predict)):
        run(HookTask(tmp_path))
        block = eval_block
        if stage != "validate":
            block = [line.replace("val_dataloader", f"{stage}_dataloader").replace("validation", stage)
                     for line in eval_block]
        expected = with_callbacks(expand(block, {"batch": VAL_BATCHES}), monitor_marker=False)
        records = _records(tmp_path, stage, 2)
        assert records[0] == expected, stage
        assert records[1] == expected, stage
