"""PyG batches on a GPU (tests/helpers/pyg_gpu_script.py, in a child process so this one never
initialises CUDA): made on the device from device blocks, PyG's GraphSAGE there, the
prefetching transfer, a 1-GPU fit. Its checks also run on CPU here, so its logic is
exercised without a GPU. Measured on a lent H100 (torch 2.11, torch-geometric 2.8.0.post1):
every check below held; benchmarks/results/pyg_vs_blocks/gpu_h100.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "pyg_gpu_script.py"
ROOT = SCRIPT.parents[2]

# A subprocess that imports torch-geometric and fits: seconds.
pytestmark = pytest.mark.slow


def _run(out, device):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", device, "--fit"], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "pyg_gpu.json").read_text())


def _check(result, device):
    conversion = result["conversion"]
    for layers in (2, 3):
        assert conversion[f"same_batch_{layers}"] and conversion[f"device_{layers}"].startswith(device)
        assert conversion[f"model_diff_{layers}"] < 1e-4
    transfer = result["transfer"]
    assert transfer["prefetched"] == (device == "cuda")
    assert [r["x_sum"] for r in transfer["rows"]] == pytest.approx(transfer["expected_sums"], rel=1e-5, abs=1e-4)
    assert all(r["devices"] == [f"{device}:0" if device == "cuda" else "cpu"] and r["type"] == "Data"
               for r in transfer["rows"])
    history = result["fit"]["history"]
    assert all(row["pyg_batches"] == 1.0 and row["on_gpu"] == float(device == "cuda") for row in history)
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@pytest.mark.timeout(300)
def test_pyg_gpu_script_runs_on_cpu_too(tmp_path):
    _check(_run(tmp_path, "cpu"), "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here; run on a GPU machine")
@pytest.mark.timeout(300)
def test_pyg_batches_on_a_gpu(tmp_path):
    pytest.importorskip("torch_geometric", reason="torch-geometric is not installed here (benchmarks/gpu_machine.sh "
                        "installs it when its wheel is carried in .whl/)")
    _check(_run(tmp_path, "cuda"), "cuda")
