"""A signal that arrives while a launcher cleans up waits for the cleanup to finish."""
from __future__ import annotations

import os
import signal
import time

import pytest

from graphtrainer.launch import leftovers


@pytest.mark.parametrize("sig,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
def test_a_signal_during_cleanup_takes_effect_after_it(sig, raised):
    def exits(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exits)
    done = []
    try:
        with pytest.raises(raised):
            with leftovers.cleanup_first():
                os.kill(os.getpid(), sig)
                os.kill(os.getpid(), sig)  # twice: delivered once
                time.sleep(0.2)  # the cleanup's work, which the signal would cut short
                done.append("cleaned up")
        assert done == ["cleaned up"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is exits
    finally:
        signal.signal(signal.SIGTERM, previous)
