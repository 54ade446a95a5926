"""``validate`` / ``test`` / ``predict`` with ``ckpt_path``, on 1, 2 and 3 ranks: exact
reduction, equal to a manual single-process computation, predictions in id order."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphtrainer import ModelCheckpoint, Trainer

from tasks import SageTask, make_graph, manual_sage_outputs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-rank fit whose "best" checkpoint is not its final state: mode="max" on a loss
    picks the worst epoch, so evaluating the wrong weights cannot pass unnoticed."""
    base = tmp_path_factory.mktemp("evaluation")
    graph = make_graph(num_nodes=165)  # 99 / 33 / 33 nodes: splits uneven over 2 and 3 ranks
    ckpt = ModelCheckpoint(dirpath=base / "ck", monitor="val_loss", mode="max", save_top_k=1, save_last=True)
    task = SageTask(graph, eval_batch_size=8)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=3, seed=1, progress_bar=False,
                      default_root_dir=base / "runs", callbacks=[ckpt])
    trainer.fit(task)
    best_state = torch.load(ckpt.best_model_path, weights_only=True)["state_dict"]
    final_state = {k: v.clone() for k, v in task.module.state_dict().items()}
    assert not torch.equal(best_state["layers.0.fc_self.weight"], final_state["layers.0.fc_self.weight"])
    return dict(graph=graph, ckpt=ckpt, task=task, trainer=trainer, best_state=best_state,
                final_state=final_state, root=base / "runs")


def manual_metrics(task, state, split, prefix):
    ids = task.split[split]
    logits = manual_sage_outputs(task, state, ids)
    labels = task.graph.ndata["label"][ids]
    return {f"{prefix}_loss": float(F.cross_entropy(logits.double(), labels)),
            f"{prefix}_acc": float((logits.argmax(1) == labels).double().mean())}


def assert_metrics_close(got, expected):
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == pytest.approx(expected[name], abs=1e-6, rel=1e-6), name


@pytest.mark.timeout(120)
def test_test_with_best_and_path_equal_on_one_and_two_ranks_and_manual(trained):
    best = trained["ckpt"].best_model_path
    expected = manual_metrics(trained["task"], trained["best_state"], "test", "test")
    two = trained["trainer"].test(SageTask(trained["graph"], eval_batch_size=8), ckpt_path="best")
    one = Trainer(progress_bar=False, default_root_dir=trained["root"]).test(
        SageTask(trained["graph"], eval_batch_size=8), ckpt_path=best)
    assert_metrics_close(two, expected)
    assert_metrics_close(one, expected)
    assert_metrics_close(one, two)
    # The final weights give other numbers: "best" really loaded the best file.
    assert manual_metrics(trained["task"], trained["final_state"], "test", "test")["test_loss"] \
        != pytest.approx(expected["test_loss"], abs=1e-6)


@pytest.mark.timeout(120)
def test_validate_with_path_and_best_equal_on_one_and_two_ranks_and_manual(trained):
    best = trained["ckpt"].best_model_path
    expected = manual_metrics(trained["task"], trained["best_state"], "val", "val")
    two = Trainer(num_procs=2, launcher="fork", progress_bar=False, default_root_dir=trained["root"]).validate(
        SageTask(trained["graph"], eval_batch_size=8), ckpt_path=best)
    one = Trainer(progress_bar=False, default_root_dir=trained["root"], callbacks=[trained["ckpt"]]).validate(
        SageTask(trained["graph"], eval_batch_size=8), ckpt_path="best")
    assert_metrics_close(two, expected)
    assert_metrics_close(one, two)
    # The best epoch's logged val_loss is the same number (it was reduced the same way).
    assert trained["ckpt"].best_model_score == pytest.approx(expected["val_loss"], abs=1e-6)
    # Last checkpoint == final weights handed back to the caller after fit.
    last = Trainer(progress_bar=False, default_root_dir=trained["root"]).validate(
        SageTask(trained["graph"], eval_batch_size=8), ckpt_path=trained["ckpt"].last_model_path)
    assert_metrics_close(last, manual_metrics(trained["task"], trained["final_state"], "val", "val"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_procs", [1, 2, 3])
def test_predict_rows_follow_the_given_ids(trained, num_procs):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randperm(trained["graph"].num_nodes(), generator=gen)[:31]  # 31: uneven on 2 and 3 ranks
    task = SageTask(trained["graph"], eval_batch_size=4, predict_ids=ids)
    trainer = Trainer(num_procs=num_procs, launcher="fork", progress_bar=False, default_root_dir=trained["root"])
    out = trainer.predict(task, ckpt_path=trained["ckpt"].best_model_path)
    expected = manual_sage_outputs(task, trained["best_state"], ids)
    assert out.shape == expected.shape == (31, 3)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    # Each row belongs to its own id (rows of different ids are far apart).
    nearest = torch.cdist(out, expected).argmin(dim=1)
    assert torch.equal(nearest, torch.arange(31))


@pytest.mark.timeout(120)
def test_predict_best_and_trained_weights_on_two_ranks(trained):
    ids = trained["task"].split["test"]
    best = trained["trainer"].predict(SageTask(trained["graph"], eval_batch_size=4), ckpt_path="best")
    assert torch.allclose(best, manual_sage_outputs(trained["task"], trained["best_state"], ids), atol=1e-5)
    # Without ckpt_path, the weights the fit handed back to the caller's task are used.
    now = Trainer(num_procs=2, launcher="fork", progress_bar=False,
                  default_root_dir=trained["root"]).predict(trained["task"])
    assert torch.allclose(now, manual_sage_outputs(trained["task"], trained["final_state"], ids), atol=1e-5)


class SampledEvalTask(SageTask):
    """Evaluation that samples neighbours (fanout 2), so its result depends on DGL's RNG."""

    def _eval_loader(self, ids):
        return self.node_dataloader(ids, [2, 2], self.eval_batch_size, shuffle=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_procs", [1, 2])
def test_sampled_evaluation_is_seeded_by_the_trainer(trained, num_procs):
    import dgl

    task = SampledEvalTask(trained["graph"], eval_batch_size=8)
    trainer = Trainer(num_procs=num_procs, seed=5, threads_per_proc=1, progress_bar=False, logger=False)
    results = []
    for disturb in (11, 12):  # whatever the generators hold before, the trainer's seed decides
        torch.manual_seed(disturb)
        dgl.seed(disturb)
        results.append(trainer.test(task, ckpt_path=trained["ckpt"].best_model_path))
    assert results[0] == results[1]
    other = Trainer(num_procs=num_procs, seed=6, threads_per_proc=1, progress_bar=False, logger=False)
    assert other.test(task, ckpt_path=trained["ckpt"].best_model_path) != results[0]  # sampling matters


class _DictPredictions(SageTask):
    def predict_step(self, batch, batch_idx):
        return {"logits": super().predict_step(batch, batch_idx)}


@pytest.mark.timeout(120)
def test_predict_step_returning_a_dict_is_refused_naming_what_it_returned(trained):
    trainer = Trainer(num_procs=1, progress_bar=False, default_root_dir=trained["root"])
    with pytest.raises(Exception, match=r"predict_step must return a tensor with one row per seed .*got dict: return "
                                        r"one tensor"):
        trainer.predict(_DictPredictions(trained["graph"], eval_batch_size=4),
                        ckpt_path=trained["ckpt"].best_model_path)
