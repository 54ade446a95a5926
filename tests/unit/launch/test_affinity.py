"""``Trainer(pin_cpus=True)``: each launched rank on its own cores of the launcher's mask,
its sampling workers (forked, or spawned by graphtrainer's loaders) on the whole mask;
``pin_cpus=False`` leaves them floating.
Real ranks (gloo on CPU), each test bounded by a timeout."""
from __future__ import annotations

import json
import os

import pytest

from graphtrainer import Trainer
from graphtrainer.process.affinity import rank_cores

from tasks import AffinityProbe


def test_ranks_take_consecutive_cores_and_wrap_round_when_they_outnumber_them():
    assert [rank_cores(r, 1, [0, 1]) for r in range(4)] == [{0}, {1}, {0}, {1}]
    assert [rank_cores(r, 2, range(4)) for r in range(2)] == [{0, 1}, {2, 3}]
    assert rank_cores(1, 1, [7, 2, 5]) == {5}  # the mask's own cores, in order
    assert rank_cores(0, 8, [0, 1]) == {0, 1}  # more threads than cores: every core


def test_pin_cpus_takes_only_true_or_false():
    with pytest.raises(ValueError, match=r"pin_cpus='no': give True or False"):
        Trainer(pin_cpus="no")


def _fit_and_read(tmp_path, launcher, **kwargs):
    out = tmp_path / "affinity"
    out.mkdir()
    Trainer(num_procs=2, launcher=launcher, max_epochs=1, progress_bar=False, enable_model_summary=False,
            logger=False, default_root_dir=tmp_path / "runs", **kwargs).fit(AffinityProbe(str(out)))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_each_rank_runs_on_its_own_cores_and_its_workers_on_all(tmp_path, launcher):
    machine = sorted(os.sched_getaffinity(0))
    seen = _fit_and_read(tmp_path, launcher)
    threads = max(1, len(machine) // 2)
    for rank, cores in enumerate(seen):
        expected = sorted(rank_cores(rank, threads, machine)) if len(machine) > 1 else machine
        assert cores["rank"] == expected, f"rank {rank}"
        assert cores["forked"] == machine, f"rank {rank}'s forked worker"
        assert cores["spawned"] == machine, f"rank {rank}'s spawned sampling worker"
    if len(machine) > 1:
        assert not set(seen[0]["rank"]) & set(seen[1]["rank"])


@pytest.mark.timeout(120)
@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_pin_cpus_false_leaves_every_rank_on_the_whole_mask(tmp_path):
    machine = sorted(os.sched_getaffinity(0))
    for cores in _fit_and_read(tmp_path, "fork", pin_cpus=False):
        assert cores == {"rank": machine, "forked": machine, "spawned": machine}
