"""The suite's own process hygiene, checked by running pytest in a subprocess: it passes as a
background job (SIGINT inherited ignored), a failing test leaves no process behind
(``process_owner``), and a process left running after the last test fails the session,
named (the session-end check in ``conftest.py``)."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: Starts the rest of the command line with SIGINT ignored, as a non-interactive shell starts
#: ``cmd &``; exec keeps an ignored signal ignored.
IGNORING_SIGINT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                                         "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"]


def _pytest_env() -> dict:
    paths = [str(ROOT), str(TESTS), str(TESTS / "helpers")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))


def _child_pytest(owner, folder: Path, body: str, timeout: float = 60):
    """Run pytest (with this suite's conftest as a plugin) over a test file made of ``body``."""
    (folder / "test_generated.py").write_text(textwrap.dedent(body))
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-s",
            "--rootdir", str(folder), str(folder / "test_generated.py")]
    return owner.run(argv, timeout=timeout, env=_pytest_env(), cwd=folder)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(path: Path, count: int) -> list:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = path.read_text().split() if path.exists() else []
        if len(pids) == count:
            return [int(p) for p in pids]
        time.sleep(0.05)
    raise AssertionError(f"{path}: expected {count} pids")


# Two generated tests. The first starts a process tree the way a launcher does, then fails: a
# direct child (the "launcher"), a grandchild in a session of its own (out of the group), and an
# orphan whose parent already exited (re-parented: no longer anyone's descendant); the
# process_owner fixture must end all three. The second passes but leaves a child and an orphan
# running, without the fixture: the session-end check must name both, end them and fail.
_GENERATED = '''
    import subprocess, sys, time
    from pathlib import Path

    OUT = Path({out!r})
    LAUNCHER = """
    import subprocess, sys
    out = open(sys.argv[1], "a")
    own = subprocess.Popen(["sleep", "300"], start_new_session=True)
    orphan = subprocess.run(["sh", "-c", "sleep 301 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    out.write(f"{{own.pid}} {{orphan.stdout.strip()}} "); out.close()
    own.wait()
    """

    def test_starts_a_run_then_fails(process_owner):
        pids = OUT / "owned"
        proc = process_owner.start([sys.executable, "-c", LAUNCHER, str(pids)])
        while len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.02)
        pids.write_text(pids.read_text() + str(proc.pid))
        assert False, "deliberately failing with its processes running"

    def test_leaves_processes_running():
        child = subprocess.Popen(["sleep", "302"])  # still pytest's child at the session's end
        orphan = subprocess.run(["sh", "-c", "sleep 303 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        (OUT / "left").write_text(f"{{child.pid}} {{orphan.stdout.strip()}}")
'''


@pytest.mark.timeout(120)
def test_a_failing_test_leaves_nothing_and_the_session_names_what_another_left(tmp_path, process_owner):
    done = _child_pytest(process_owner, tmp_path, _GENERATED.format(out=str(tmp_path)))
    out = done.stdout + done.stderr
    assert "1 failed, 1 passed" in out and "deliberately failing" in out, out
    owned = _pids(tmp_path / "owned", 3)  # the grandchild in its own session, the orphan, the launcher
    child, orphan = _pids(tmp_path / "left", 2)
    assert not [p for p in owned + [child, orphan] if _alive(p)], out
    fixture, _, session = out.partition("processes left running")
    assert all(f"pid {p}:" in fixture for p in owned), out  # the fixture ended (and named) them ...
    assert not [p for p in owned if f"pid {p}:" in session], out  # ... so the session check did not
    assert "2 process(es)" in session, out
    assert f"pid {child}: sleep 302" in session and f"pid {orphan}: sleep 303" in session, out
    assert done.returncode == pytest.ExitCode.TESTS_FAILED


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ctrl_c_tests_pass_when_pytest_starts_with_sigint_ignored(tmp_path, process_owner):
    """As under ``nohup pytest ... &`` from a script: the tests that send SIGINT to a run still
    pass (before: the run ignored it and trained on, left behind by the failed test)."""
    nodes = ["tests/integration/test_faults_launcher.py::test_ctrl_c_to_the_process_group_leaves_nothing",
             "tests/integration/test_faults.py::test_signal_during_save_leaves_no_partial_file[SIGINT]"]
    argv = IGNORING_SIGINT + ["-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes]
    started = time.monotonic()
    done = process_owner.run(argv, timeout=360, env=_pytest_env(), cwd=ROOT)
    out = done.stdout + done.stderr
    print(f"Ctrl-C tests under an ignored SIGINT: {time.monotonic() - started:.1f} s")
    assert "SIGINT is ignored (inherited" in out, out  # the session did start with SIGINT ignored
    assert done.returncode == 0 and "3 passed" in out, out[-4000:]


def test_ignoring_wrapper_really_ignores_sigint(tmp_path, process_owner):
    """The wrapper the test above relies on: the process it starts has SIGINT ignored."""
    done = process_owner.run(IGNORING_SIGINT + ["-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
                             timeout=30)
    assert done.stdout.strip() == str(signal.SIG_IGN), done
