"""Which line of an aborted rank's stderr names the reason."""
from __future__ import annotations

from graphtrainer.launch.rank_stderr import last_words

GLOO = "  what():  [enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 23052 vs 4"


def test_the_reason_is_found_before_libxsmm_exit_report_whatever_its_command_line_says():
    tail = "\n".join(["terminate called after throwing an instance of 'gloo::EnforceNotMet'", GLOO, "",
                      "LIBXSMM_VERSION: unconfigured (2147483647)", "LIBXSMM_TARGET: hsw [AMD EPYC]",
                      "Registry and code: 13 MB + 48 KB (meltw=6)",
                      "Command: python -m pytest tests/integration/test_engine_failure.py", "Uptime: 519.9 s"])
    assert last_words(tail) == GLOO.strip()


def test_without_a_reason_the_last_line_is_taken():
    assert last_words("first\nsecond\n") == "second"
