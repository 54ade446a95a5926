"""``self.log``: the trainer's own columns (``epoch``, ``step``) cannot be overwritten, Lightning's
``sync_dist`` is accepted (the reduction is always exact), its other options are refused with
graphtrainer's way; so are Lightning's ``Trainer`` arguments."""
from __future__ import annotations

import pytest

from graphtrainer import RankFailedError, Trainer

from tasks import RegressionTask


class LogsWith(RegressionTask):
    def __init__(self, name="x", **options):
        super().__init__(n=16)
        self.name, self.options = name, options

    def training_step(self, idx, batch_idx):
        loss = super().training_step(idx, batch_idx)
        self.log(self.name, 2.0, **self.options)
        return loss


def _fit(root, task, **kw):
    return Trainer(max_epochs=2, progress_bar=False, enable_model_summary=False, default_root_dir=root, **kw).fit(task)


@pytest.mark.parametrize("options", [dict(sync_dist=True), dict(sync_dist=False, on_epoch=True)])
def test_sync_dist_is_accepted_and_the_value_is_the_exact_mean(root_dir, options):
    trainer = _fit(root_dir, LogsWith(**options))
    assert [row["x"] for row in trainer.history] == [2.0, 2.0]


@pytest.mark.parametrize("name", ["epoch", "step"])
def test_the_trainers_own_columns_cannot_be_logged(root_dir, name):
    with pytest.raises(ValueError, match=rf"self.log\('{name}', ...\): '{name}' is reserved for the trainer's own "
                                         rf"count .* log it as e.g. 'my_{name}'"):
        _fit(root_dir, LogsWith(name))


@pytest.mark.parametrize("options, way", [
    (dict(on_step=True), "training values are logged per step"),
    (dict(on_epoch=False), "every logged value has an epoch value"),
    (dict(rank_zero_only=True), "every logged value is reduced exactly over all ranks .*, so every rank must log"),
    (dict(logger=False), "every logged value goes to the logger"),
])
def test_lightning_options_are_refused_naming_graphtrainers_way(root_dir, options, way):
    (option, value), = options.items()
    with pytest.raises(TypeError, match=rf"self.log\('x', ..., {option}={value}\) is Lightning's; "
                                        rf"graphtrainer: {way}"):
        _fit(root_dir, LogsWith(**options))


@pytest.mark.timeout(60)
def test_a_refused_option_in_two_ranks_names_it(root_dir):
    with pytest.raises(RankFailedError, match=r"rank_zero_only=True\) is Lightning's") as info:
        _fit(root_dir, LogsWith(rank_zero_only=True), num_procs=2, launcher="fork")
    assert info.value.error_type == "TypeError"


@pytest.mark.parametrize("option, way", [
    (dict(accelerator="gpu"), r"Trainer\(accelerator='gpu'\) is Lightning's; graphtrainer: gpus=N"),
    (dict(devices=2), r"Trainer\(devices=2\) is Lightning's; graphtrainer: gpus=N or gpus=\[0, 1\]"),
    (dict(strategy="ddp"), r"every run is DDP; launcher='fork'"),
    (dict(enable_progress_bar=False), r"graphtrainer: progress_bar=False"),
    (dict(max_epoch=3), r"unexpected keyword argument 'max_epoch' \(docs/lightning-habits.md"),
])
def test_lightnings_trainer_arguments_are_refused_naming_graphtrainers_way(option, way):
    from graphtrainer import Trainer

    with pytest.raises(TypeError, match=way):
        Trainer(**option)
