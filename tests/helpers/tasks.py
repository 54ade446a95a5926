"""Tasks shared by the checkpoint, callback, logger and evaluation tests.

Defined at module level so that spawned ranks can import them. DGL is imported only
inside the graph task's methods, so the plain-torch task runs without it.

- :class:`RegressionTask`: an MLP on a fixed random regression problem, fed by
  :class:`IndexBatches` (plain-torch, DDP-aware batches of row indices). Optional
  dropout, momentum SGD and an LR scheduler, so that resuming must restore RNG,
  optimizer and scheduler state. ``script`` logs chosen values per epoch (to drive
  ModelCheckpoint / EarlyStopping decisions).
- :class:`SageTask`: GraphSAGE node classification on a small random graph with a
  real neighbour sampler (fanouts smaller than most degrees, so DGL's RNG matters).
"""
from __future__ import annotations

import math
import os
import signal
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch._dynamo  # noqa: F401  (see below)
import torch.nn.functional as F
from torch import nn

from graphtrainer import GraphTask
from graphtrainer import comm as gdist
from graphtrainer.callbacks import Callback
from graphtrainer.data.sharded_loader import ShardedLoader
from graphtrainer.data.sharding import shard_ids

# torch.optim and DDP import torch._dynamo lazily, at first use. Imported once here, in the
# test process, every forked rank inherits it instead of paying ~1.5 s to import it again.


# ---- plain torch ---------------------------------------------------------------------
class IndexBatches:
    """This rank's share of ``range(n)`` for one epoch, in batches of index tensors.

    The same permutation of ``(seed, epoch)`` on every rank, split with
    :func:`graphtrainer.data.sharding.shard_ids`; for evaluation every index exactly once.
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.even = "pad"
        self.epoch = 0
        self.ids = torch.arange(n)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def for_evaluation(self) -> "IndexBatches":
        self.shuffle, self.even = False, "none"
        return self

    def _share(self) -> torch.Tensor:
        return shard_ids(self.ids, gdist.get_rank(), gdist.get_world_size(), epoch=self.epoch,
                         seed=self.seed, shuffle=self.shuffle, even=self.even)

    def __len__(self) -> int:
        return math.ceil(self._share().numel() / self.batch_size)

    def __iter__(self):
        share = self._share()
        return iter([share[i:i + self.batch_size] for i in range(0, share.numel(), self.batch_size)])


class ExactBatches(ShardedLoader):
    """Index batches of an exact length: every rank has as many, so epochs run without Join."""

    def __iter__(self):
        return iter(self.local_batches())

    def __len__(self):
        return len(self.local_batches())


def regression_data(n: int, d: int, seed: int = 0, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    w = torch.randn(d, 1, generator=gen)
    y = scale * (torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=gen))
    return x, y


class RegressionTask(GraphTask):
    """MLP regression with momentum SGD and an optional scheduler.

    ``scheduler``: None, "step" (StepLR per epoch, returned as ``([opt], [sched])``),
    "step_interval" (dict form, StepLR stepped every optimizer step), "plateau"
    (ReduceLROnPlateau on ``plateau_monitor``) or "bare" (return just the optimizer).
    ``script``: ``{name: [value per epoch]}`` (or one such list per rank) logged with
    weight 1 at the validation epoch end (or at the train epoch end without validation).
    """

    def __init__(self, n: int = 64, d: int = 4, hidden: int = 16, dropout: float = 0.0, lr: float = 0.1,
                 momentum: float = 0.9, batch_size: int = 8, scheduler: Optional[str] = "step",
                 gamma: float = 0.5, validate: bool = True, script: Optional[Dict[str, List[float]]] = None,
                 plateau_monitor: str = "val_loss", scale: float = 1.0, fail_at_epoch: Optional[int] = None,
                 fail_rank: int = 0, hard_fail: bool = False, eval_batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.x, self.y = regression_data(n, d, seed=1, scale=scale)
        self.vx, self.vy = regression_data(24, d, seed=2, scale=scale)
        self.d, self.hidden, self.dropout, self.lr, self.momentum = d, hidden, dropout, lr, momentum
        self.n, self.batch_size, self.scheduler, self.gamma = n, batch_size, scheduler, gamma
        self.validate, self.script, self.plateau_monitor = validate, script or {}, plateau_monitor
        self.fail_at_epoch, self.fail_rank, self.hard_fail = fail_at_epoch, fail_rank, hard_fail
        self.eval_batch_size = eval_batch_size

    def configure_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.d, self.hidden), nn.ReLU(), nn.Dropout(self.dropout),
                             nn.Linear(self.hidden, 1))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=self.momentum)
        if self.scheduler == "bare":
            return opt
        if self.scheduler is None:
            return [opt], []
        if self.scheduler == "step":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.gamma)]
        if self.scheduler == "step_interval":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.gamma)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        if self.scheduler == "plateau":
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=self.gamma, patience=0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": self.plateau_monitor}}
        raise ValueError(self.scheduler)

    def train_dataloader(self) -> Any:
        return IndexBatches(self.n, self.batch_size, seed=self.trainer.seed if self.trainer else 0)

    def val_dataloader(self) -> Any:
        return IndexBatches(self.vx.shape[0], self.eval_batch_size, shuffle=False) if self.validate else None

    def test_dataloader(self) -> Any:
        return IndexBatches(self.vx.shape[0], self.eval_batch_size, shuffle=False)

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self.model(self.x[idx]), self.y[idx])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, idx: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", F.mse_loss(self.model(self.vx[idx]), self.vy[idx]))

    def test_step(self, idx: torch.Tensor, batch_idx: int) -> None:
        self.log("test_loss", F.mse_loss(self.model(self.vx[idx]), self.vy[idx]))

    def _log_script(self) -> None:
        for name, values in self.script.items():
            if isinstance(values[0], (list, tuple)):  # one sequence per rank
                values = values[self.rank]
            self.log(name, values[self.current_epoch], batch_size=1)

    def on_validation_epoch_end(self) -> None:
        if self.script:
            self._log_script()

    def on_train_epoch_start(self) -> None:
        if self.fail_at_epoch is not None and self.current_epoch == self.fail_at_epoch \
                and self.rank == self.fail_rank:
            if self.hard_fail:
                import os

                os._exit(3)  # a crash: no Python cleanup, no exception report
            raise RuntimeError(f"planned failure at epoch {self.current_epoch}")

    def on_train_epoch_end(self) -> None:
        if not self.validate and self.script:
            self._log_script()


# ---- DGL -----------------------------------------------------------------------------
def make_graph(num_nodes: int = 160, avg_degree: int = 8, feat_dim: int = 8, num_classes: int = 3,
               seed: int = 0) -> Any:
    """A random undirected graph with ``feat``, ``label`` and train/val/test masks."""
    import dgl

    gen = torch.Generator().manual_seed(seed)
    m = num_nodes * avg_degree // 2
    src = torch.randint(0, num_nodes, (m,), generator=gen)
    dst = torch.randint(0, num_nodes, (m,), generator=gen)
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=num_nodes)
    feat = torch.randn(num_nodes, feat_dim, generator=gen)
    proj = torch.randn(feat_dim, num_classes, generator=gen)
    g.ndata["feat"] = feat
    g.ndata["label"] = (feat @ proj).argmax(1)
    perm = torch.randperm(num_nodes, generator=gen)
    n_train, n_val = num_nodes * 6 // 10, num_nodes * 2 // 10
    for name, ids in (("train", perm[:n_train]), ("val", perm[n_train:n_train + n_val]),
                      ("test", perm[n_train + n_val:])):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[ids] = True
        g.ndata[f"{name}_mask"] = mask
    return g


class SageTask(GraphTask):
    """GraphSAGE node classification: sampled training, full-neighbour evaluation."""

    def __init__(self, graph: Any, fanouts: Sequence[int] = (4, 4), hidden: int = 16, dropout: float = 0.5,
                 lr: float = 0.05, batch_size: int = 16, eval_batch_size: int = 16, gamma: float = 0.7,
                 predict_ids: Optional[torch.Tensor] = None):
        super().__init__()
        self.save_hyperparameters("fanouts", "hidden", "dropout", "lr", "batch_size")
        self.graph = graph
        self.fanouts, self.hidden, self.dropout, self.lr = list(fanouts), hidden, dropout, lr
        self.batch_size, self.eval_batch_size, self.gamma = batch_size, eval_batch_size, gamma
        self.split = {s: graph.ndata[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}
        self.predict_ids = predict_ids if predict_ids is not None else self.split["test"]

    def configure_model(self) -> nn.Module:
        from graphtrainer.models import SAGE

        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, int(self.graph.ndata["label"].max()) + 1,
                    num_layers=len(self.fanouts), dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.gamma)]

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.split["train"], self.fanouts, self.batch_size, shuffle=True)

    def _eval_loader(self, ids: torch.Tensor) -> Any:
        return self.node_dataloader(ids, full_sampler(len(self.fanouts)), self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader(self.split["val"])

    def test_dataloader(self) -> Any:
        return self._eval_loader(self.split["test"])

    def predict_dataloader(self) -> Any:
        return self._eval_loader(self.predict_ids)

    def _forward(self, batch: Any):
        _, _, blocks = batch
        return self.model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)
        return loss

    def _eval(self, batch: Any, prefix: str) -> None:
        logits, labels = self._forward(batch)
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels))
        self.log(f"{prefix}_acc", (logits.argmax(1) == labels).float().mean())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._forward(batch)[0]


def full_sampler(num_layers: int) -> Any:
    import dgl

    return dgl.dataloading.MultiLayerFullNeighborSampler(num_layers, prefetch_node_feats=["feat"],
                                                         prefetch_labels=["label"])


def manual_sage_outputs(task: SageTask, state_dict: Dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Logits for ``ids`` (in that order) from one full-neighbourhood forward in this process."""
    model = task.configure_model()
    model.load_state_dict(state_dict)
    model.eval()
    g = task.graph
    _, output_nodes, blocks = full_sampler(len(task.fanouts)).sample(g, ids)
    assert torch.equal(output_nodes, ids)
    with torch.no_grad():
        return model(blocks, g.ndata["feat"][blocks[0].srcdata["_ID"]])


# ---- callbacks used by several test files ---------------------------------------------
class Recorder(Callback):
    """Records per-rank facts into a directory (one JSON file per rank), so that a test
    can compare what every rank saw. ``state_dict`` carries rank 0's record back to the
    caller (the trainer returns callback states)."""

    after_reduction = True
    # Runs with the checkpoint callbacks, after those before it in the list: sees their decisions.
    saves_checkpoints = True

    def __init__(self, out_dir: Optional[str] = None):
        self.out_dir = out_dir
        self.rows: List[Dict[str, Any]] = []

    @property
    def state_key(self) -> str:
        return "Recorder"

    def state_dict(self) -> Dict[str, Any]:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.rows = list(state.get("rows", []))

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        from graphtrainer import EarlyStopping, ModelCheckpoint

        row: Dict[str, Any] = {"epoch": trainer.current_epoch, "should_stop": trainer.should_stop}
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint):
                row["best_model_path"] = cb.best_model_path
                row["best_k_models"] = dict(cb.best_k_models)
            if isinstance(cb, EarlyStopping):
                row["wait_count"] = cb.wait_count
        self.rows.append(row)
        if self.out_dir is not None:
            import json
            import os

            with open(os.path.join(self.out_dir, f"rank{trainer.rank}.json"), "w") as fh:
                json.dump(self.rows, fh)


# ---- engine tests (test_engine_*.py) -----------------------------------------------------
class FullSageTask(SageTask):
    """GraphSAGE trained with a full-neighbour sampler, no dropout and plain SGD: nothing
    random after the model is built, so the arithmetic of any number of ranks can be
    compared with one rank."""

    def __init__(self, graph: Any, batch_size: int, lr: float = 0.5, record_dir: Optional[str] = None,
                 ids: Optional[torch.Tensor] = None, drop_last: bool = False, model_seed: Optional[int] = None):
        super().__init__(graph, fanouts=(-1, -1), dropout=0.0, lr=lr, batch_size=batch_size)
        self.record_dir, self.drop_last = record_dir, drop_last
        self.ids = ids if ids is not None else self.split["train"]
        self.seen: List[int] = []
        if model_seed is not None:  # built here, in the launching process, not in the ranks
            torch.manual_seed(model_seed)
            self.model = self.configure_model()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids, full_sampler(2), self.batch_size, drop_last=self.drop_last)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen += batch[1].tolist()
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        if self.record_dir is not None:  # seeds this rank trained on, per epoch
            import json
            import os

            with open(os.path.join(self.record_dir, f"seen_r{self.rank}_e{self.current_epoch}.json"), "w") as fh:
                json.dump(self.seen, fh)
        self.seen = []


class ParamDump(Callback):
    """Saves the plain model's parameters on every rank at every epoch end (and at fit start)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def _dump(self, trainer: Any, task: Any, tag: str) -> None:
        import os

        state = {k: v.detach().clone() for k, v in task.module.state_dict().items()}
        torch.save(state, os.path.join(self.out_dir, f"{tag}_r{trainer.rank}.pt"))

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        self._dump(trainer, task, "start")

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        self._dump(trainer, task, f"e{trainer.current_epoch}")

    @staticmethod
    def load(out: Any, tag: str, rank: int) -> Dict[str, torch.Tensor]:
        """What rank ``rank`` dumped under ``tag`` into ``out``."""
        import os

        return torch.load(os.path.join(str(out), f"{tag}_r{rank}.pt"), weights_only=True)


def max_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_two_ranks_match_one(one: Any, two: Any, epochs: int) -> Dict[str, torch.Tensor]:
    """``ParamDump`` folders of a 1-rank run (batch 2b) and a 2-rank run (batch b): after every
    epoch both ranks hold identical parameters, equal to the 1-rank run's within 1e-5, and
    training moved them. Returns the 2-rank run's final parameters."""
    for epoch in range(epochs):
        r0, r1 = ParamDump.load(two, f"e{epoch}", 0), ParamDump.load(two, f"e{epoch}", 1)
        for name in r0:
            assert torch.equal(r0[name], r1[name]), (epoch, name)
        single = ParamDump.load(one, f"e{epoch}", 0)
        for name in r0:
            torch.testing.assert_close(r0[name], single[name], atol=1e-5, rtol=0, msg=f"{epoch} {name}")
    final = ParamDump.load(two, f"e{epochs - 1}", 0)
    assert max_diff(final, ParamDump.load(two, "start", 0)) > 1e-2  # training moved the weights
    return final


class FailingTask(RegressionTask):
    """Rank ``fail_rank`` misbehaves in ``training_step`` once ``global_step`` reaches
    ``at_step``: ``how="raise"`` raises, ``"kill"`` SIGKILLs itself, ``"sleep"`` hangs (sleeps
    for ten minutes), ``"nan"`` returns a NaN loss from then on."""

    def __init__(self, how: str = "raise", at_step: int = 3, fail_rank: int = 1, **kwargs: Any):
        kwargs.setdefault("scheduler", None)
        super().__init__(n=64, batch_size=8, **kwargs)
        self.how, self.at_step, self.fail_rank = how, at_step, fail_rank

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.rank == self.fail_rank and self.global_step >= self.at_step:
            if self.how == "nan":
                return super().training_step(idx, batch_idx) * float("nan")
            if self.global_step == self.at_step:
                if self.how == "kill":
                    import os
                    import signal

                    os.kill(os.getpid(), signal.SIGKILL)
                if self.how == "sleep":
                    import time

                    time.sleep(600)  # the hang the launcher must name
                raise RuntimeError(f"planned failure in training_step at step {self.global_step}")
        return super().training_step(idx, batch_idx)


class _AffinityOfWorker(torch.utils.data.Dataset):
    """One item: the cores the sampling worker that loads it may run on."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> torch.Tensor:
        import os

        return torch.tensor(sorted(os.sched_getaffinity(0)))


class AffinityProbe(RegressionTask):
    """Writes ``rank<r>.json`` to ``out_dir`` in its first training step: the cores the rank's
    training thread may run on; those of a worker its torch ``DataLoader`` forks; and those of
    a worker it spawns with graphtrainer's sampling-worker init (a spawned rank's DGL workers)."""

    def __init__(self, out_dir: str):
        super().__init__(validate=False)
        self.out_dir = out_dir

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            import json
            import os

            from graphtrainer.data.workers import _WorkerInit

            seen = {"rank": sorted(os.sched_getaffinity(0))}
            for name, context, init in (("forked", "fork", None), ("spawned", "spawn", _WorkerInit())):
                loader = torch.utils.data.DataLoader(_AffinityOfWorker(), batch_size=None, num_workers=1,
                                                     multiprocessing_context=context, worker_init_fn=init)
                seen[name] = next(iter(loader)).tolist()
            with open(os.path.join(self.out_dir, f"rank{self.trainer.rank}.json"), "w", encoding="utf-8") as fh:
                json.dump(seen, fh)
        return super().training_step(idx, batch_idx)


class SigtermAt(RegressionTask):
    """Sends itself SIGTERM during step ``at_step`` (a scheduler preempting the job)."""

    def __init__(self, at_step: Optional[int] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.at_step = at_step

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(idx, batch_idx)
