"""Two machines, two partitions: each simulated machine is a network namespace with its
own address and /dev/shm, made by this test (graphtrainer.testing.simulated_machines), running
the same script with the same ip_config, as on a real cluster."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphtrainer import datasets
from graphtrainer.distdgl.partition import load_orig_ids, partition_graph
from graphtrainer.testing.simulated_machines import SimulatedMachines, can_simulate, wait_all

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "dist_tasks.py"
POSSIBLE, WHY_NOT = can_simulate()


def run_two_machines(tmp_path: Path, config: Path, epochs: int, fail: str = "") -> tuple:
    """Both machines' script in their namespaces; ``(first bad return code, output)``.
    Afterwards no namespace and no process of theirs is left."""
    with SimulatedMachines(2) as machines:
        ip_config = machines.ip_config(str(tmp_path / "ip_config.txt"))
        logs = [open(tmp_path / f"machine{m}.log", "w") for m in range(2)]
        argv = [sys.executable, str(SCRIPT), str(config), ip_config, str(tmp_path), str(epochs)]
        procs = [machines.popen(m, argv + [str(m), fail], stdout=logs[m], stderr=subprocess.STDOUT) for m in range(2)]
        try:
            failed = wait_all(procs, timeout=360)
        finally:
            for log in logs:
                log.close()
        output = "\n".join(f"--- machine {m} ---\n" + (tmp_path / f"machine{m}.log").read_text()[-3000:]
                           for m in range(2))
    assert machines.existing() == [] and all(p.poll() is not None for p in procs)
    return failed, output


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(not POSSIBLE, reason=f"cannot simulate machines here: {WHY_NOT}")
def test_two_machines_train_cora_to_the_floor_and_leave_nothing(tmp_path):
    cora = datasets.load("cora")
    config = partition_graph(cora, "cora", 2, tmp_path / "parts").config
    epochs = 40
    failed, output = run_two_machines(tmp_path, config, epochs)
    assert failed is None, output

    results = [json.loads((tmp_path / f"machine{m}.json").read_text()) for m in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and all(r["world_size"] == 2 for r in results)
    print("two machines:", results[0]["test"], results[0]["last_epoch"])
    assert results[0]["test"] == results[1]["test"], output  # reduced over both machines
    assert results[0]["test"]["test_acc"] >= 0.78, output
    assert results[0]["test"]["test_nodes"] == 1000 and results[0]["last_epoch"]["val_nodes"] == 500
    # Two partitions: batches are read through the DistGraph, not from one machine's memory.
    for rank in range(2):
        assert json.loads((tmp_path / f"local_r{rank}.json").read_text()) == {"loader_uses_shared_graph": False}

    # Each machine trained on its own partition's training nodes: all of them, once per epoch.
    orig = load_orig_ids(config)["nodes"]
    train_ids = cora.ndata["train_mask"][orig].nonzero().squeeze(1)
    for epoch in (0, epochs - 1):
        seen = torch.load(tmp_path / f"seeds_epoch{epoch}.pt")
        assert torch.equal(torch.sort(seen).values, train_ids)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not POSSIBLE, reason=f"cannot simulate machines here: {WHY_NOT}")
def test_a_rank_failing_on_one_machine_ends_every_machine_naming_it(tmp_path):
    """Machine 1's rank raises at step 3. Machine 0's rank was waiting on it (gloo, or a DGL
    RPC that never returns); machine 0 stops within seconds all the same, raising the
    original error with the failed machine and rank, reported by machine 1's launcher."""
    config = partition_graph(datasets.load("cora"), "cora", 2, tmp_path / "parts").config
    failed, output = run_two_machines(tmp_path, config, 50, fail="raise")
    assert failed is not None, output
    errors = [json.loads((tmp_path / f"machine{m}.json").read_text()) for m in range(2)]
    for err in errors:
        assert err["type"] == "RankFailedError", output
        assert err["error"].startswith("rank 1 on machine 1 (127.100.0.2) failed: RuntimeError: trainer fault at step 3"), \
            output
    assert "this machine's ranks were stopped" in errors[0]["error"]
    assert abs(errors[0]["at"] - errors[1]["at"]) < 15, errors  # not after machine 0's hang_timeout (120 s)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not POSSIBLE, reason=f"cannot simulate machines here: {WHY_NOT}")
def test_a_machine_that_never_starts_ends_the_run_saying_what_to_check(tmp_path):
    """Only machine 0 of two runs: its ranks wait for machine 1's graph server forever (DGL
    retries for 50 minutes); hang_timeout ends the run with the likely cause."""
    config = partition_graph(datasets.load("cora"), "cora", 2, tmp_path / "parts").config
    with SimulatedMachines(2) as machines:
        ip_config = machines.ip_config(str(tmp_path / "ip_config.txt"))
        with open(tmp_path / "machine0.log", "w") as log:
            proc = machines.popen(0, [sys.executable, str(SCRIPT), str(config), ip_config, str(tmp_path), "1", "0",
                                      "alone"], stdout=log, stderr=subprocess.STDOUT)
            failed = wait_all([proc], timeout=120)
    assert machines.existing() == []
    output = (tmp_path / "machine0.log").read_text()[-3000:]
    assert failed is not None, output
    err = json.loads((tmp_path / "machine0.json").read_text())["error"]
    assert "waiting in graph servers" in err and "is the script running on every machine" in err, err
