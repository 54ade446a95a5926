"""The warning about a forked rank's DGL random stream names the real cause: with several threads
per rank a forked rank runs in a fresh thread, whose stream follows the launching process's history
(not the order of the imports), and only a clean process (forkserver, spawn) avoids it."""
from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import graphtrainer  # noqa: F401  (before DGL: the main thread holds stream 0)
from graphtrainer._compat import dgl_2_1_streams as streams


def _warnings_in_a_fresh_thread(monkeypatch, rank, deterministic):
    import dgl  # noqa: F401

    monkeypatch.setattr(streams, "_in_fresh_thread", False)
    streams.note_fresh_rank_thread()
    seen = []

    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            streams.warn_if_dgl_stream_moved(rank, deterministic)
        seen.extend(str(w.message) for w in caught)

    worker = threading.Thread(target=run)  # a new thread: a stream number past the main thread's
    worker.start()
    worker.join()
    return seen


def test_a_fresh_rank_thread_is_blamed_on_fork_not_on_the_imports(monkeypatch):
    [message] = _warnings_in_a_fresh_thread(monkeypatch, 0, True)
    assert "launcher='fork' with several threads per rank" in message
    assert "launcher='forkserver' or 'spawn'" in message and "imported" not in message


@pytest.mark.parametrize("rank, deterministic", [(1, True), (0, False)])
def test_it_is_said_once_and_only_where_sampling_should_repeat(monkeypatch, rank, deterministic):
    # Without deterministic=True two threads do not repeat anyway, and the loader says so.
    assert _warnings_in_a_fresh_thread(monkeypatch, rank, deterministic) == []


_DRIVER = """
import sys
sys.path.insert(0, {helpers!r})
import torch
from graphtrainer import Trainer
from tasks import RegressionTask
import dgl  # noqa: F401
if __name__ == "__main__":
    torch.set_num_threads(2)
    a = torch.randn(600, 600)
    assert torch.isfinite((a @ a).sum())  # an OpenMP pool here: forked ranks run in fresh threads
    Trainer(num_procs=2, launcher="fork", threads_per_proc=2, max_epochs=1, deterministic=True,
            progress_bar=False, logger=False, enable_model_summary=False).fit(RegressionTask())
"""


@pytest.mark.slow  # a fresh interpreter: the ranks' warnings reach its stderr as a user's would
@pytest.mark.timeout(120)
def test_fork_with_two_threads_per_rank_names_forkserver(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(helpers=str(Path(__file__).resolve().parents[2] / "helpers")))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("launcher='fork' with several threads per rank") == 1, out.stderr
    assert "before graphtrainer was imported" not in out.stderr
