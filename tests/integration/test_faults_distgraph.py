"""DistDGL faults: a damaged partition is refused before any graph server loads it (DGL's
loader would fill a cut feature file's missing rows with zeros and train on them)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import own_temp_folders, rank_children
from launch_env import env_without_launch
from dist_tasks import CORA
from graphtrainer import Trainer, datasets
from graphtrainer.examples.node_classification import NodeClassification
from graphtrainer.cli.partition import partition_graph


@pytest.fixture(scope="module")
def cora_config(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora1")
    return partition_graph(datasets.load("cora"), "cora", 1, out).config


def _cut_in_half(path):
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    return size


@pytest.mark.timeout(120)
def test_a_cut_feature_file_is_refused_before_the_servers_load_it(tmp_path, cora_config):
    feat = cora_config.parent / "part0" / "node_feat.dgl"
    meta_path = cora_config.with_name("cora.meta.json")
    original, original_meta = feat.read_bytes(), meta_path.read_text()
    folders = own_temp_folders()
    try:
        size = _cut_in_half(feat)
        started = time.monotonic()
        with pytest.raises(ValueError, match=rf"{feat} has {size // 2} bytes where {size} were written, so part 0 "
                                             r"is damaged: copy part 0 again .* or partition again"):
            Trainer(num_procs=2, max_epochs=1, default_root_dir=tmp_path, progress_bar=False,
                    enable_model_summary=False).fit(NodeClassification(str(cora_config), **CORA))
        print(f"cut partition refused in {time.monotonic() - started:.2f} s")
        assert not rank_children() and list(tmp_path.iterdir()) == []
        # A partition recorded before per-file sizes: its part's total size is checked.
        meta = json.loads(meta_path.read_text())
        del meta["files"]
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=r"part0 hold \d+ bytes where \d+ were written, so part 0 is damaged"):
            Trainer(num_procs=2, max_epochs=1, default_root_dir=tmp_path, progress_bar=False,
                    enable_model_summary=False).fit(NodeClassification(str(cora_config), **CORA))
        assert own_temp_folders() == folders  # no written ip_config (or other folder) outlives a refusal
    finally:
        feat.write_bytes(original)
        meta_path.write_text(original_meta)


TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules and drivers
SHM = Path("/dev/shm")


def _segments() -> set:
    return {p.name for p in SHM.iterdir() if p.name.startswith(("cora", "node~", "edge~"))}


def _driver(cora_config, workdir, *extra):
    env = env_without_launch(TMPDIR=str(workdir / "tmp"), PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]))
    return [sys.executable, str(TESTS / "fault_driver.py"), f"distgraph={cora_config}", str(workdir), *extra], env


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_what_a_killed_distdgl_launcher_left_is_removed_by_the_next_run(tmp_path, cora_config, process_owner):
    (tmp_path / "tmp").mkdir()
    argv, env = _driver(cora_config, tmp_path)
    proc = process_owner.start(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not all((tmp_path / f"rank{r}.pid").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while rank_children() and time.monotonic() < deadline:  # servers and ranks die with the launcher
        time.sleep(0.05)
    left = _segments()  # (the names are DGL's, the same for every Cora run: not told apart from `before`)
    folders = sorted(p.name for p in (tmp_path / "tmp").iterdir())
    assert left and any(name.startswith(f"graphtrainer-servers-{proc.pid}-") for name in folders), (left, folders)
    argv, env = _driver(cora_config, tmp_path, "1")
    again = process_owner.run(argv, env=env, timeout=200)
    assert again.returncode == 0, again.stderr
    assert "removed what a run that no longer runs left behind" in again.stderr
    for name in left:
        assert f"/dev/shm/{name}" in again.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_a_distdgl_launcher_stops_the_ranks_which_checkpoint(tmp_path, cora_config, process_owner):
    (tmp_path / "tmp").mkdir()
    before = _segments()
    argv, env = _driver(cora_config, tmp_path)
    proc = process_owner.start(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not all((tmp_path / f"rank{r}.pid").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # as a scheduler stops a job
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    # The launcher passes SIGTERM to every rank; the agreement names the highest rank that had it
    # by the exchange, which on a loaded machine may be rank 0 alone.
    assert re.search(r"fit stopped by SIGTERM \(received by rank [01]\) at ", err), err[-3000:]
    assert list((tmp_path / "runs").glob("version_*/checkpoints/last.ckpt"))
    assert not rank_children()
    assert _segments() <= before  # the servers were stopped and their shared memory removed
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_twice_to_a_distdgl_launcher_leaves_nothing(tmp_path, cora_config):
    """The second Ctrl-C comes while the launcher ends the ranks (each takes 1.5 s to act on
    SIGINT): the ranks' stacks folder, the servers' folder and segments, the ip_config folder go."""
    (tmp_path / "tmp").mkdir()
    before = _segments()
    argv, env = _driver(cora_config, tmp_path, "100000", "slow_exit")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 200
    while not all((tmp_path / f"rank{r}.pid").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal, twice
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    assert not rank_children()
    assert _segments() <= before
    assert list((tmp_path / "tmp").iterdir()) == []
