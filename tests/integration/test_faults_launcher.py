"""The launching process itself killed or stopped (SIGKILL, SIGTERM as schedulers send):
nothing of the run goes on, and what a killed run left is removed by the next one.

Each test runs ``fault_driver.py`` in a process of its own (in a session of its own, started by
the ``process_owner`` fixture, which ends whatever is left when the test ends, passed or
failed), waits for the files the ranks write once they train, signals that process, then
watches the processes it had started."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from graphtrainer import ModelCheckpoint, RankFailedError, Trainer
from graphtrainer.launch import forkserver, supervisor

from conftest import rank_children
from launch_env import env_without_launch
from tasks import FailingTask, RegressionTask

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules and drivers
DRIVER = TESTS / "fault_driver.py"


def _start(owner, launcher: str, workdir: Path, *extra: str) -> tuple:
    """Start the driver with its own temp folder through ``owner`` (the ``process_owner``
    fixture); return it and its descendants once both ranks train.
    ``launcher="torchrun"``: torchrun's agent starts two drivers."""
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    env = env_without_launch(TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]))
    agent = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = (agent if launcher == "torchrun" else [sys.executable]) + [str(DRIVER), launcher, str(workdir), *extra]
    proc = owner.start(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, _training(proc, workdir)


def _training(proc: subprocess.Popen, workdir: Path) -> list:
    """``proc``'s descendants, once both ranks wrote ``workdir/rank<r>.pid`` (they train)."""
    deadline = time.monotonic() + 100
    while not all((workdir / f"rank{r}.pid").exists() for r in (0, 1)):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.05)
    return psutil.Process(proc.pid).children(recursive=True)


def _gone_within(procs: list, seconds: float) -> float:
    """Seconds until every process of ``procs`` has ended (fails after ``seconds``)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - start
        time.sleep(0.02)
    for p in alive:
        p.kill()
    raise AssertionError(f"still running {seconds} s after the launcher was signalled: "
                         f"{[(p.pid, p.cmdline()[-3:]) for p in alive]}")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher,sig", [("forkserver", signal.SIGKILL), ("forkserver", signal.SIGTERM),
                                          ("fork", signal.SIGTERM), ("spawn", signal.SIGKILL)])
def test_killing_the_launching_process_ends_the_whole_run(tmp_path, launcher, sig, process_owner):
    proc, descendants = _start(process_owner, launcher, tmp_path)
    ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
    assert set(ranks) <= {p.pid for p in descendants}
    signalled = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    ended = time.monotonic() - signalled
    took = _gone_within(descendants, 20)  # ranks, fork server, resource tracker
    print(f"{launcher} launcher {sig.name}: launcher ended {ended:.2f} s after the signal, every process "
          f"{took:.2f} s after that")
    if sig == signal.SIGTERM:  # passed on to the ranks: they stop at the next batch and checkpoint
        assert proc.returncode == 75, err
        # The launcher passes SIGTERM to every rank; the agreement names the highest rank that had it
        # by the exchange, which on a loaded machine may be rank 0 alone.
        assert re.search(r"fit stopped by SIGTERM \(received by rank [01]\) at ", err), err[-3000:]
        assert list((tmp_path / "runs").glob("version_*/checkpoints/last.ckpt"))
        assert list((tmp_path / "tmp").iterdir()) == []  # its temp folder went with it


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_to_the_whole_process_group_stops_a_forkserver_fit_as_a_preemption(tmp_path, process_owner):
    """As Slurm stops a job step (every process of it gets SIGTERM): the fork server outlives it
    (before: it died, and the run failed with ForkServerDied, status 1), the ranks stop and checkpoint."""
    proc, descendants = _start(process_owner, "forkserver", tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)  # the driver runs in a session of its own
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err[-3000:]
    assert re.search(r"fit stopped by SIGTERM \(received by rank [01]\) at ", err), err[-3000:]
    assert list((tmp_path / "runs").glob("version_*/checkpoints/last.ckpt"))
    _gone_within(descendants, 20)  # ranks, fork server, resource tracker


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["fork", "forkserver"])
def test_ctrl_c_to_the_process_group_leaves_nothing(tmp_path, launcher, process_owner, terminal_sigint):
    # terminal_sigint: the run takes SIGINT as under a terminal even when this session inherited it
    # ignored (a background job), which the run would keep (tests/unit/test_suite_hygiene.py)
    proc, descendants = _start(process_owner, launcher, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the group
    proc.communicate(timeout=60)
    took = _gone_within(descendants, 20)
    print(f"{launcher}: Ctrl-C to the group: every process gone {took:.2f} s after the launcher ended")
    assert proc.returncode != 0
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["fork", "spawn", "forkserver"])
def test_ctrl_c_twice_leaves_nothing(tmp_path, launcher, process_owner, terminal_sigint):
    """The second Ctrl-C comes while the launcher ends the ranks (each takes 1.5 s to act on
    SIGINT): the launcher's cleanup finishes first."""
    proc, descendants = _start(process_owner, launcher, tmp_path, "100000", "slow_exit")
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = _gone_within(descendants, 20)
    print(f"{launcher}: Ctrl-C twice, 0.3 s apart: every process gone {took:.2f} s after the launcher ended")
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_sigterm_while_a_rank_hangs_ends_the_run_at_once_naming_the_hang(tmp_path, launcher, process_owner):
    """A stop waits for a batch boundary that a hung rank never reaches: the launcher names the
    hang once SIGTERM came (hang_timeout=60 here), and ends the run."""
    proc, descendants = _start(process_owner, launcher, tmp_path, "100000", "hang")
    deadline = time.monotonic() + 60
    while not (tmp_path / "hung_at").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "rank 1 never reached its hang"
        time.sleep(0.05)
    time.sleep(2.0)  # hung: no progress for 2 s
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    _gone_within(descendants, 20)
    print(f"{launcher}: SIGTERM while rank 1 hangs: launcher ended {took:.1f} s after it")
    assert proc.returncode == 1, err[-3000:]
    assert re.search(r"RankFailedError: rank 1 failed: Hang: no progress for [0-9.]+ s after a stop signal "
                     r"\(SIGTERM/SIGUSR1\).*: rank 1 in training_step \(epoch 0, batch 3\)", err), err[-3000:]
    assert took < 5
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_ranks_end_when_the_agent_is_killed(tmp_path, process_owner):
    agent, descendants = _start(process_owner, "torchrun", tmp_path)
    ranks = [psutil.Process(int((tmp_path / f"rank{r}.pid").read_text())) for r in (0, 1)]
    agent.kill()
    agent.communicate(timeout=60)
    took = _gone_within(ranks + descendants, 20)
    print(f"torchrun agent SIGKILL: both ranks gone {took:.2f} s after the agent ended")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_next_run_removes_what_a_killed_run_left(tmp_path, process_owner):
    proc, descendants = _start(process_owner, "fork", tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    _gone_within(descendants, 20)
    left = list((tmp_path / "tmp").iterdir())
    assert [p.name.split("-")[:3] for p in left] == [["graphtrainer", "stacks", str(proc.pid)]]
    live = tmp_path / "tmp" / f"graphtrainer-stacks-{os.getpid()}-live"  # a run that still runs
    live.mkdir()
    for name in ("rank0.pid", "rank1.pid"):
        (tmp_path / name).unlink()
    again = process_owner.run([sys.executable, str(DRIVER), "fork", str(tmp_path), "1"], timeout=120,
                              env=dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
                                       PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)])))
    assert again.returncode == 0, again.stderr
    assert f"removed what a run that no longer runs left behind: {left[0]}" in again.stderr
    assert list((tmp_path / "tmp").iterdir()) == [live]


class _KillsTheForkServer(FailingTask):
    """Rank 0 SIGKILLs its parent, the fork server, at ``at_step``, where rank 1 raises its own
    error (``FailingTask``): the server takes a moment to die, and rank 1's error, and rank 0's
    on losing its peer, may reach the launcher first."""

    def training_step(self, idx, batch_idx):
        if self.rank == 0 and self.global_step == self.at_step:
            os.kill(os.getppid(), signal.SIGKILL)
        return super().training_step(idx, batch_idx)


def _server_death_reported_late(monkeypatch, late_s: float) -> None:
    """In this (the launching) process, ``os.waitpid`` reports the fork server's end ``late_s``
    after it could first have: the kernel reports it a moment after the server has closed its
    files (its ranks' pipes), a moment stretched here past the watch's settling time."""
    real, held = os.waitpid, {}

    def waitpid(pid, options):
        if pid not in held and pid != forkserver.server_pid():
            return real(pid, options)
        if pid not in held:
            done, status = real(pid, options)
            if not done:
                return done, status
            held[pid] = (time.monotonic() + late_s, status)
        reported_at, status = held[pid]
        if time.monotonic() < reported_at:
            if options & os.WNOHANG:
                return 0, 0
            time.sleep(reported_at - time.monotonic())
        return pid, status

    monkeypatch.setattr(os, "waitpid", waitpid)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("reported_late", [False, True])
def test_a_killed_fork_server_is_named(root_dir, monkeypatch, reported_late):
    """Also when the ranks' errors surely arrive, and the ranks are gone, before the kernel
    reports the server's death (``reported_late``)."""
    if reported_late:  # later than the watch settles, sooner than it waits for a server whose pipes closed
        late_s = supervisor.FAILURE_SETTLE_S + 0.25
        assert late_s < forkserver.EXIT_NOTICE_S
        _server_death_reported_late(monkeypatch, late_s)
    trainer = Trainer(num_procs=2, launcher="forkserver", max_epochs=5, progress_bar=False,
                      default_root_dir=root_dir, enable_model_summary=False)
    with pytest.raises(RankFailedError) as info:
        trainer.fit(_KillsTheForkServer(how="raise", at_step=3))
    err = info.value
    assert err.error_type == "ForkServerDied" and err.process.startswith("the fork server (pid ")
    assert "killed by signal SIGKILL while the ranks ran" in str(err)
    assert "could not import the script" not in str(err)
    assert not rank_children() and forkserver.server_pid() is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_partial_checkpoint_of_a_killed_writer_is_removed_by_the_next_fit(root_dir, tmp_path, capfd):
    from test_faults import _BigCheckpoint

    pid_file = tmp_path / "rank0.pid"
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=50, progress_bar=False, default_root_dir=root_dir,
                      enable_model_summary=False, callbacks=[ModelCheckpoint(save_last=True)])
    outcome = {}

    def run():
        try:
            trainer.fit(_BigCheckpoint(str(pid_file)))
        except BaseException as err:  # noqa: BLE001
            outcome["error"] = err

    runner = threading.Thread(target=run)
    runner.start()
    folder = root_dir / "version_0" / "checkpoints"
    deadline = time.monotonic() + 90
    while not list(folder.glob(".*.tmp-*")) and time.monotonic() < deadline and runner.is_alive():
        time.sleep(0.005)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # rank 0, mid-save
    runner.join(60)
    assert isinstance(outcome.get("error"), RankFailedError)
    partial = list(folder.glob(".*.tmp-*"))
    assert len(partial) == 1  # what SIGKILL leaves
    capfd.readouterr()
    Trainer(num_procs=1, max_epochs=1, progress_bar=False, default_root_dir=root_dir, enable_model_summary=False,
            callbacks=[ModelCheckpoint(save_last=True)]).fit(RegressionTask())  # writes into version_1
    assert not partial[0].exists()
    assert f"removed partial checkpoint files of writers that no longer run: {partial[0]}" in capfd.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher, threads", [("fork", 1), ("spawn", 1), ("forkserver", 1), ("fork", 2)])
def test_ctrl_c_to_a_command_line_fit_ends_it_with_one_line_and_status_130(tmp_path, process_owner, terminal_sigint,
                                                                           launcher, threads):
    """``python -m graphtrainer fit`` under Ctrl-C: the ranks end quietly (the launcher's cleanup),
    then one line and status 130 as shells expect, no KeyboardInterrupt traceback from the command
    nor from a rank. threads=2 with fork: each rank's fit runs in a thread of its own (the command
    has threads when it forks), so SIGINT finds the rank's main thread waiting on it."""
    import yaml

    config = {"trainer": {"num_procs": 2, "max_epochs": 100000, "progress_bar": False, "launcher": launcher,
                          "threads_per_proc": threads, "default_root_dir": str(tmp_path / "runs")},
              "task": {"class_path": "fault_driver.Marked", "init_args": {"ready_dir": str(tmp_path)}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "tmp").mkdir()
    env = env_without_launch(TMPDIR=str(tmp_path / "tmp"),
                             PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]))
    proc = process_owner.start([sys.executable, "-m", "graphtrainer", "fit", "--config", str(tmp_path / "run.yaml")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    descendants = _training(proc, tmp_path)  # both ranks are past their first training step: mid-fit
    os.killpg(proc.pid, signal.SIGINT)  # every process of the group, as Ctrl-C in a terminal
    _sigint_ranks_until_gone(tmp_path, descendants)
    _, err = proc.communicate(timeout=60)
    _gone_within(descendants, 20)
    assert proc.returncode == 130, err[-3000:]
    # The newest stack's triton (nanobind) reports leaks, without a final newline, when the fork
    # server exits (in every forkserver run): no traceback, and not the ranks' doing.
    err = re.sub(r"nanobind: leaked .*?refleaks\.html", "", err, flags=re.S)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]


def _sigint_ranks_until_gone(workdir: Path, descendants: list, seconds: float = 3.0) -> None:
    """SIGINT the ranks again and again while they unwind from the first one (as the launcher's
    cleanup does once, and Ctrl-C pressed again would): each must still end quietly."""
    pids = {int((workdir / f"rank{r}.pid").read_text()) for r in (0, 1)}
    ranks = [p for p in descendants if p.pid in pids]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks):
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.send_signal(signal.SIGINT)  # psutil checks it is still that process
        time.sleep(0.01)
