"""Two machines, two partitions: each simulated machine is a network namespace with its
own address and /dev/shm, made by this test (graphtrainer.simulated_machines), running
the same script with the same ip_config, as on a real cluster."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphtrainer import datasets
from graphtrainer.partition import load_orig_ids, partition_graph
from graphtrainer.simulated_machines import SimulatedMachines, can_simulate, wait_all

SCRIPT = Path(__file__).resolve().parent / "dist_tasks.py"
POSSIBLE, WHY_NOT = can_simulate()


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(not POSSIBLE, reason=f"cannot simulate machines here: {WHY_NOT}")
def test_two_machines_train_cora_to_the_floor_and_leave_nothing(tmp_path):
    cora = datasets.load("cora")
    config = partition_graph(cora, "cora", 2, tmp_path / "parts").config
    epochs = 40
    with SimulatedMachines(2) as machines:
        ip_config = machines.ip_config(str(tmp_path / "ip_config.txt"))
        logs = [open(tmp_path / f"machine{m}.log", "w") for m in range(2)]
        procs = [machines.popen(m, [sys.executable, str(SCRIPT), str(config), ip_config, str(tmp_path), str(epochs)],
                                stdout=logs[m], stderr=subprocess.STDOUT) for m in range(2)]
        try:
            failed = wait_all(procs, timeout=360)
        finally:
            for log in logs:
                log.close()
        output = "\n".join(f"--- machine {m} ---\n" + (tmp_path / f"machine{m}.log").read_text()[-3000:]
                           for m in range(2))
        assert failed is None, output
    assert machines.existing() == [] and all(p.poll() is not None for p in procs)

    results = [json.loads((tmp_path / f"machine{m}.json").read_text()) for m in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and all(r["world_size"] == 2 for r in results)
    print("two machines:", results[0]["test"], results[0]["last_epoch"])
    assert results[0]["test"] == results[1]["test"], output  # reduced over both machines
    assert results[0]["test"]["test_acc"] >= 0.78, output
    assert results[0]["test"]["test_nodes"] == 1000 and results[0]["last_epoch"]["val_nodes"] == 500

    # Each machine trained on its own partition's training nodes: all of them, once per epoch.
    orig = load_orig_ids(config)["nodes"]
    train_ids = cora.ndata["train_mask"][orig].nonzero().squeeze(1)
    for epoch in (0, epochs - 1):
        seen = torch.load(tmp_path / f"seeds_epoch{epoch}.pt")
        assert torch.equal(torch.sort(seen).values, train_ids)
