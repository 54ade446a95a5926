"""The stop-signal flag: set while a fit trains (also in a thread whose main thread routes the
signals), the signal's usual effect otherwise. Real signals, in a fresh interpreter."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading
    from graphtrainer.launch import stop_flag

    def worker(train):
        if train:
            with stop_flag.caught():
                os.kill(os.getpid(), signal.SIGUSR1)
                while stop_flag.requested() is None:  # the main thread runs the handler
                    pass
                print("flag", stop_flag.requested(), flush=True)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    with stop_flag.routed():
        thread = threading.Thread(target=worker, args=(sys.argv[1] == "train",))
        thread.start()
        thread.join()
    print("after", flush=True)
""")


@pytest.mark.timeout(60)
def test_a_thread_that_trains_gets_the_flag_from_the_routing_main_thread():
    done = subprocess.run([sys.executable, "-c", SCRIPT, "train"], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["flag", str(int(signal.SIGUSR1)), "after"]


@pytest.mark.timeout(60)
def test_outside_training_a_routed_sigterm_still_ends_the_process():
    done = subprocess.run([sys.executable, "-c", SCRIPT, "idle"], capture_output=True, text=True, timeout=50)
    assert done.returncode == -signal.SIGTERM and "after" not in done.stdout, (done.returncode, done.stderr)
