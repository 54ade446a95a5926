"""The launchers of a job over several machines tell each other their failures through a
store machine 0's launcher serves (graphtrainer.distdgl.job_failures); here all on loopback."""
from __future__ import annotations

import socket
import time

import pytest

from graphtrainer.launch.environment import free_port
from graphtrainer.distdgl.job_failures import JobFailures


def _wait_for(job: JobFailures, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while job.reported() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return job.reported()


@pytest.mark.timeout(60)
def test_the_first_failure_reported_reaches_every_other_launcher():
    port = free_port()
    serving = JobFailures("127.0.0.1", port, serve=True)  # machine 0's launcher
    first, second = JobFailures("127.0.0.1", port, serve=False), JobFailures("127.0.0.1", port, serve=False)
    try:
        deadline = time.monotonic() + 10
        while not first.connected and time.monotonic() < deadline:  # connected in the background
            time.sleep(0.05)
        first.report(3, "1 (10.0.0.2)", "RuntimeError", "trainer fault at step 3")
        expected = {"rank": 3, "machine": "1 (10.0.0.2)", "error_type": "RuntimeError",
                    "message": "trainer fault at step 3"}
        assert _wait_for(serving) == expected and _wait_for(second) == expected
        assert first.reported() is None  # its own report is not news to it
        second.report(5, "2 (10.0.0.3)", "RuntimeError", "a consequence")  # too late: the first stands
        assert _wait_for(serving) == expected
    finally:
        for job in (first, second, serving):
            job.close()


@pytest.mark.timeout(60)
def test_a_port_that_cannot_be_served_warns_and_the_run_goes_on():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.warns(UserWarning, match="cannot serve the machines' failure reports"):
            job = JobFailures("127.0.0.1", port, serve=True)
        job.report(0, "0 (127.0.0.1)", "RuntimeError", "x")  # nothing to write to: no error
        assert job.reported() is None
        job.close()
