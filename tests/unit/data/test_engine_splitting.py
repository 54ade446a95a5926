"""Splitting seed ids between ranks: ``shard_ids`` arithmetic, then what real 2- and 3-rank
runs train and evaluate on (recorded seeds), tiny id sets, and user-made loaders."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List

import pytest
import torch

from graphtrainer import Callback, RankFailedError, Trainer
from graphtrainer.data.sharding import shard_ids

from conftest import rank_children
from tasks import FullSageTask, ParamDump, full_sampler, make_graph

SEED = 11


def _trainer(root_dir, world, epochs=2, callbacks=()):
    return Trainer(num_procs=world, launcher="fork", max_epochs=epochs, seed=SEED, progress_bar=False,
                   default_root_dir=root_dir, logger=False, callbacks=list(callbacks))


def _seen(out: Path, world: int, epoch: int, prefix: str = "seen") -> List[List[int]]:
    return [json.loads((out / f"{prefix}_r{r}_e{epoch}.json").read_text()) for r in range(world)]


def _interleave(shares: List[List[int]]) -> List[int]:
    """The global order rank shares were cut from: rank r's i-th id sits at r + i * world."""
    world = len(shares)
    order = [None] * sum(len(s) for s in shares)
    for r, share in enumerate(shares):
        order[r::world] = share
    return order


# ---- shard_ids, in this process -------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 5, 12, 97])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_ids_pad_drop_none(n, world):
    ids = torch.arange(100, 100 + n)
    perm = shard_ids(ids, 0, 1, epoch=2, seed=SEED).tolist()
    assert sorted(perm) == ids.tolist()

    pad = [shard_ids(ids, r, world, epoch=2, seed=SEED).tolist() for r in range(world)]
    size = math.ceil(n / world)
    assert all(len(s) == size for s in pad)
    assert all(len(set(s)) == len(s) for s in pad)  # no rank holds an id twice
    flat = _interleave(pad)
    assert flat[:n] == perm  # the permutation, then repeats from its start
    assert flat[n:] == (perm * world)[: size * world - n]

    drop = [shard_ids(ids, r, world, epoch=2, seed=SEED, even="drop").tolist() for r in range(world)]
    assert all(len(s) == n // world for s in drop)
    assert _interleave(drop) == perm[: (n // world) * world]

    none = [shard_ids(ids, r, world, epoch=2, seed=SEED, shuffle=False, even="none").tolist()
            for r in range(world)]
    assert _interleave(none) == ids.tolist()  # evaluation: every id once, in the given order


def test_shard_ids_permutation_depends_on_seed_and_epoch_only():
    ids = torch.arange(50)
    orders = {(s, e): shard_ids(ids, 0, 1, epoch=e, seed=s).tolist() for s in (0, 1) for e in (0, 1)}
    assert len({tuple(o) for o in orders.values()}) == 4
    assert orders[(0, 0)] != ids.tolist()
    assert shard_ids(ids, 0, 1, epoch=1, seed=1).tolist() == orders[(1, 1)]
    with pytest.raises(ValueError, match="even='bogus'"):
        shard_ids(ids, 0, 2, even="bogus")


# ---- real runs -------------------------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_each_id_once_per_epoch_same_permutation_on_all_ranks(root_dir, tmp_path, world):
    graph = make_graph(num_nodes=160)
    task = FullSageTask(graph, batch_size=8, record_dir=str(tmp_path))  # 96 ids: no padding on 2 or 3
    _trainer(root_dir, world, epochs=3).fit(task)
    ids = task.split["train"]
    orders = []
    for epoch in range(3):
        shares = _seen(tmp_path, world, epoch)
        assert all(len(s) == 96 // world for s in shares)
        assert sorted(sum(shares, [])) == sorted(ids.tolist())  # each id exactly once
        order = _interleave(shares)
        # Every rank cut its share from the same global permutation of (seed, epoch).
        assert order == shard_ids(ids, 0, 1, epoch=epoch, seed=SEED).tolist()
        orders.append(order)
    assert orders[0] != orders[1] != orders[2] != orders[0]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_padding_repeats_and_drop_last_drops(root_dir, tmp_path, world):
    graph = make_graph(num_nodes=160)
    ids = torch.arange(97)
    pad_dir, drop_dir = tmp_path / "pad", tmp_path / "drop"
    pad_dir.mkdir(), drop_dir.mkdir()
    _trainer(root_dir, world, epochs=1).fit(FullSageTask(graph, 8, ids=ids, record_dir=str(pad_dir)))
    shares = _seen(pad_dir, world, 0)
    size = math.ceil(97 / world)
    assert all(len(s) == size and len(set(s)) == size for s in shares)
    order = _interleave(shares)
    perm = shard_ids(ids, 0, 1, epoch=0, seed=SEED).tolist()
    assert order[:97] == perm and order[97:] == perm[: size * world - 97]

    # drop_last: the permutation's tail that does not split evenly is dropped, then each
    # rank's last incomplete batch (of 10).
    _trainer(root_dir, world, epochs=1).fit(FullSageTask(graph, 10, ids=ids, drop_last=True,
                                                         record_dir=str(drop_dir)))
    shares = _seen(drop_dir, world, 0)
    kept = (97 // world) // 10 * 10
    assert len(set(sum(shares, []))) == kept * world  # no id twice, on any rank
    for r, share in enumerate(shares):
        assert share == perm[: 97 // world * world][r::world][:kept]


class EvalTask(FullSageTask):
    """Validation logs the mean of the seed ids it sees and records them per rank."""

    def __init__(self, graph: Any, train_ids: torch.Tensor, val_ids: torch.Tensor, out: str):
        super().__init__(graph, batch_size=4, ids=train_ids, record_dir=out)
        self.val_ids, self.val_seen = val_ids, []

    def val_dataloader(self) -> Any:
        return self.node_dataloader(self.val_ids, full_sampler(2), 2)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        seeds = batch[1]
        self.val_seen += seeds.tolist()
        self.log("val_id_mean", seeds.double().mean(), batch_size=seeds.numel())

    def on_validation_epoch_end(self) -> None:
        with open(Path(self.record_dir) / f"val_r{self.rank}_e{self.current_epoch}.json", "w") as fh:
            json.dump(self.val_seen, fh)
        self.val_seen = []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("n_val", [5, 1])
def test_evaluation_sees_every_id_once_exact_mean(root_dir, tmp_path, world, n_val):
    graph = make_graph(num_nodes=160)
    val_ids = torch.tensor([3, 50, 7, 120, 99][:n_val])
    train_ids = torch.tensor([5])  # one training id for 2 or 3 ranks: padded, so it works
    task = EvalTask(graph, train_ids, val_ids, str(tmp_path))
    trainer = _trainer(root_dir, world, epochs=1)
    trainer.fit(task)
    assert _seen(tmp_path, world, 0) == [[5]] * world
    shares = _seen(tmp_path, world, 0, prefix="val")
    assert sorted(sum(shares, [])) == sorted(val_ids.tolist())
    exact = float(val_ids.double().mean())
    assert trainer.history[0]["val_id_mean"] == pytest.approx(exact, rel=1e-12)
    assert trainer.validate(task)["val_id_mean"] == pytest.approx(exact, rel=1e-12)


class ExceptionLog(Callback):
    def __init__(self, out: str):
        self.out = out

    def on_exception(self, trainer: Any, task: Any, error: BaseException) -> None:
        (Path(self.out) / f"error_r{trainer.rank}.txt").write_text(f"{type(error).__name__}: {error}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_tiny_id_set_with_drop_last_fails_clearly_on_every_rank(root_dir, tmp_path, world):
    graph = make_graph(num_nodes=160)
    task = FullSageTask(graph, 4, ids=torch.tensor([5]), drop_last=True)
    with pytest.raises(RankFailedError, match=f"1 seed ids cannot be split between {world} ranks "
                                              "with drop_last=True") as info:
        _trainer(root_dir, world, callbacks=[ExceptionLog(str(tmp_path))]).fit(task)
    assert info.value.error_type == "ValueError"
    for r in range(world):
        assert "cannot be split" in (tmp_path / f"error_r{r}.txt").read_text()
    assert not rank_children()


class DGLDDPLoaderTask(FullSageTask):
    """Trains on DGL's own ``DataLoader(use_ddp=True)``: each rank a fixed contiguous slice."""

    def train_dataloader(self) -> Any:
        import dgl

        return dgl.dataloading.DataLoader(self.graph, self.ids, full_sampler(2), batch_size=8, shuffle=True,
                                          use_ddp=True)


@pytest.mark.timeout(90)
def test_users_own_dgl_ddp_dataloader_trains(root_dir, tmp_path):
    graph = make_graph(num_nodes=160)
    dump = tmp_path / "params"
    dump.mkdir()
    task = DGLDDPLoaderTask(graph, 8, record_dir=str(tmp_path))
    trainer = _trainer(root_dir, 2, callbacks=[ParamDump(str(dump))])
    trainer.fit(task)
    ids = task.split["train"].tolist()
    for epoch in range(2):
        shares = _seen(tmp_path, 2, epoch)
        assert sorted(shares[0]) == sorted(ids[:48]) and sorted(shares[1]) == sorted(ids[48:])
        r0 = torch.load(dump / f"e{epoch}_r0.pt", weights_only=True)
        r1 = torch.load(dump / f"e{epoch}_r1.pt", weights_only=True)
        assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert trainer.global_step == 2 * 6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world, n", [(2, 1), (3, 4)])
def test_dgl_ddp_dataloader_tiny_id_set_fails_clearly_on_every_rank(root_dir, tmp_path, world, n):
    # DGL 2.1 would pad the last rank from uninitialised memory and segfault there.
    task = DGLDDPLoaderTask(make_graph(num_nodes=160), 8, ids=torch.arange(n))
    with pytest.raises(RankFailedError, match=rf"DataLoader\(use_ddp=True\) cannot split {n} ids between "
                                              rf"{world} ranks.*node_dataloader"):
        _trainer(root_dir, world, callbacks=[ExceptionLog(str(tmp_path))]).fit(task)
    for r in range(world):
        assert (tmp_path / f"error_r{r}.txt").read_text().startswith("ValueError: dgl.dataloading")
    assert not rank_children()
