"""Smoke tests of tutorials/11_one_machine_to_many.py, each run as a user runs it, with a timeout:
``--fast`` (partition; DistDGL on this machine and the same task in memory), ``--simulate 2
--fast`` (two simulated machines), and the sbatch file under a stand-in ``srun`` whose
tasks run on simulated machines. The last two need root (network namespaces).

After each run nothing of it may be left: no process (the script's, its ranks', its graph
servers'), no network namespace, and no new DistDGL shared-memory segment in /dev/shm
(``cora*``, ``node~*``) that no live process maps (one that a process maps belongs to
another run on this box)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Set, Tuple

import psutil
import pytest
import yaml

from graphtrainer.testing.simulated_machines import SimulatedMachines, can_simulate
from tutorial_run import ROOT, load_module, script, tutorial_env
from tutorial_results import check_figures

# Several interpreters, graph servers and ranks per run: tens of seconds each.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

SCRIPT = script("11_one_machine_to_many.py")
SBATCH = ROOT / "tutorials" / "11_one_machine_to_many.sbatch"
SHM = "/dev/shm"
TIMEOUT = 240
CAN_SIMULATE, WHY_NOT = can_simulate()
needs_root = pytest.mark.skipif(not CAN_SIMULATE, reason=WHY_NOT or "cannot simulate machines")


def _shm() -> Set[str]:
    return set(os.listdir(SHM)) if os.path.isdir(SHM) else set()


def _mapped_shm() -> Set[str]:
    """Names under /dev/shm that a live process maps."""
    names: Set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as fh:
                for line in fh:
                    at = line.find(f"{SHM}/")
                    if at >= 0:
                        names.add(line[at + len(SHM) + 1:].split()[0])
        except OSError:
            continue
    return names


def _left_segments(before: Set[str]) -> Set[str]:
    new = {n for n in _shm() - before if n.startswith(("cora", "node~"))}
    return new - _mapped_shm() if new else new


def _processes_mentioning(marker: str) -> List[str]:
    """Live processes whose command line or DGL partition config names ``marker`` (this
    test's folder): the script, its ranks and its graph servers."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            conf = proc.environ().get("DGL_CONF_PATH", "") if proc.pid != os.getpid() else ""
            if proc.status() != psutil.STATUS_ZOMBIE and (marker in cmd or marker in conf):
                found.append(f"{proc.pid}: {cmd[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _run(argv: List[str], timeout: float, **env: str) -> Tuple[subprocess.Popen, str]:
    """Run ``argv`` in a session of its own; on timeout end that session and fail."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=tutorial_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s; output so far:\n{out[-4000:]}")
    with pytest.raises(ProcessLookupError):   # nothing left in its process group: servers, ranks
        os.killpg(proc.pid, 0)
    return proc, out


def _results(out: str, label: str) -> dict:
    """The ``<label>: best val_acc ... test_acc ...`` line the script prints."""
    m = re.search(rf"^(?:\[machine \d+\] )?{re.escape(label)}: best val_acc ([\d.]+) over (\d+) nodes, test_acc "
                  rf"([\d.]+) over (\d+) nodes, (\d+) ranks", out, re.M)
    assert m, f"no {label!r} line in:\n{out[-3000:]}"
    return {"best_val_acc": float(m[1]), "val_nodes": int(m[2]), "test_acc": float(m[3]),
            "test_nodes": int(m[4]), "ranks": int(m[5])}


def test_settings_are_tutorial_1s():
    yaml_args = yaml.safe_load((ROOT / "tutorials" / "01_quickstart_cora.yaml").read_text())["task"]["init_args"]
    yaml_args.pop("graph")
    assert load_module("11_one_machine_to_many.py").SETTINGS == yaml_args


@pytest.mark.timeout(TIMEOUT + 30)
def test_fast_partition_then_distdgl_and_in_memory(tmp_path):
    shm_before = _shm()
    out_dir = tmp_path / "out"
    proc, out = _run([sys.executable, str(SCRIPT), "--fast", "--root-dir", str(tmp_path / "runs"),
                      "--out", str(out_dir)], TIMEOUT, GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, out[-4000:]
    # Step 1: the partition command's table, one part holding all of Cora.
    assert re.search(r"^\s+0\s+2708\s+0\s+10556\s+140\s", out, re.M), out[:2000]
    # Step 2: both runs print their results; every validation and test node scored once
    # (Cora's split: 500 and 1,000), over the 2 ranks.
    dist, memory = _results(out, "DistDGL, 1 partition"), _results(out, "in memory")
    for r in (dist, memory):
        assert (r["val_nodes"], r["test_nodes"], r["ranks"]) == (500, 1000, 2), r
        # Chance is 1/7 (0.30 for the majority class); 2 epochs reach about 0.65.
        assert r["best_val_acc"] > 0.45 and r["test_acc"] > 0.45, r
    assert re.search(r"^test_acc: DistDGL [\d.]+, in memory [\d.]+", out, re.M)
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["epochs"] == 2 and s["distdgl"]["epochs"] == 2 and s["in_memory"]["epochs"] == 2
    assert s["distdgl"]["test_acc"] == pytest.approx(dist["test_acc"], abs=1e-4)
    assert Path(s["distdgl"]["checkpoint"]).is_file()
    # The figures that tutorials/results/11_one_machine_to_many.json records, within its tolerances.
    check_figures("11_one_machine_to_many", s)
    # Nothing left: processes (checked in _run too), shared memory.
    assert _processes_mentioning(str(tmp_path)) == []
    assert _left_segments(shm_before) == set()


@needs_root
@pytest.mark.timeout(TIMEOUT + 30)
def test_simulate_two_machines(tmp_path):
    shm_before = _shm()
    out_dir = tmp_path / "out"
    proc, out = _run([sys.executable, str(SCRIPT), "--simulate", "2", "--fast", "--root-dir", str(tmp_path / "runs"),
                      "--out", str(out_dir), "--timeout", str(TIMEOUT - 30)], TIMEOUT,
                     GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, out[-4000:]
    assert "[sim] exit codes: machine 0 0, machine 1 0" in out
    # Each machine found its own line of ip_config by address.
    assert "[machine 0] machine 0 of 2 (127.100.0.1)" in out and "[machine 1] machine 1 of 2 (127.100.0.2)" in out
    # The metrics are reduced over the 4 ranks of both machines: both print the same.
    m0, m1 = _results(out, "machine 0"), _results(out, "machine 1")
    assert m0 == m1
    assert (m0["val_nodes"], m0["test_nodes"], m0["ranks"]) == (500, 1000, 4), m0
    assert m0["test_acc"] > 0.3, m0                   # 2 epochs on 4 ranks: about 0.56
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["exit_codes"] == [0, 0] and s["namespaces_left"] == []
    assert [m["machine_rank"] for m in s["per_machine"]] == [0, 1]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in s["namespaces"])
    assert _processes_mentioning(str(tmp_path)) == []
    assert _left_segments(shm_before) == set()


# Stand-in for Slurm's srun: task i runs on simulated machine i (its network namespace
# and /dev/shm), with the variables srun sets for each task.
FAKE_SRUN = """#!/bin/bash
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
read -r -a machines <<< "$FAKE_SRUN_NETNS"
read -r -a shms <<< "$FAKE_SRUN_SHM"
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NODEID=$i SLURM_NTASKS=$SLURM_NNODES \\
        ip netns exec "${machines[$i]}" sh -c 'mount --bind "$0" /dev/shm && exec "$@"' "${shms[$i]}" "$@" &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
"""


# Stand-in for hostname: -I prints the simulated machine's address.
FAKE_HOSTNAME = """#!/bin/bash
ip -4 -o addr show dev eth0 | awk '{split($4, a, "/"); print a[1]}'
"""


@needs_root
@pytest.mark.timeout(TIMEOUT + 60)
def test_sbatch_under_stand_in_srun_on_simulated_machines(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    (bindir / "hostname").write_text(FAKE_HOSTNAME)  # real hostname -I leaves out loopback addresses
    (bindir / "hostname").chmod(0o755)
    out_dir = tmp_path / "out"
    with SimulatedMachines(2) as machines:
        proc, out = _run(["bash", str(SBATCH), "--fast"], TIMEOUT, PATH=f"{bindir}:{os.environ['PATH']}",
                         FAKE_SRUN_NETNS=" ".join(machines.names), FAKE_SRUN_SHM=" ".join(machines.shm_dirs),
                         PYTHON=sys.executable,
                         SLURM_JOB_ID="4242", SLURM_NNODES="2", SLURM_JOB_NODELIST="node[01-02]",
                         SLURM_SUBMIT_DIR=str(ROOT), OUT=str(out_dir),
                         PART_CONFIG=str(tmp_path / "parts" / "cora.json"), GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
        assert machines.pids() == []
    assert proc.returncode == 0, out[-4000:]
    # ip_config from the "nodes'" own addresses, in SLURM_NODEID order, on the job's port.
    port = 15000 + (4242 % 2000) * 8
    assert (out_dir / "ip_config.txt").read_text() == "".join(f"{a} {port}\n" for a in machines.addresses)
    summaries = [json.loads((out_dir / f"machine{m}" / "summary.json").read_text()) for m in (0, 1)]
    assert [s["machine_rank"] for s in summaries] == [0, 1]      # from SLURM_NODEID
    for s in summaries:
        assert (s["epochs"], s["world_size"], s["val_nodes"], s["test_nodes"]) == (2, 4, 500, 1000), s
        assert s["test_acc"] == summaries[0]["test_acc"]
    assert _processes_mentioning(str(tmp_path)) == []
