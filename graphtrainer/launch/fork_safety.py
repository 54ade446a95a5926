"""Whether ranks may be forked or spawned from this process: probes a throw-away fork for
CUDA/autograd state, reads the main script for a missing ``__main__`` guard, and picks the
start method from ``Trainer(launcher=...)`` accordingly."""
from __future__ import annotations

import ast
import inspect
import os
import signal
import sys
import time
import warnings
from typing import Any, Optional

import torch

#: Where fork is unsafe (CUDA or autograd threads already started here), what "auto" uses.
FORK_FALLBACK = "forkserver"


def start_method(launcher: str, uses_gpu: bool, task: Any) -> str:
    """The start method for ``Trainer(launcher=launcher)`` ("auto": fork on Linux unless a fork
    could not train, then forkserver), refusing spawn or forkserver without an importable main."""
    method = launcher
    if method == "auto":
        method = "fork" if sys.platform.startswith("linux") else "spawn"
    blocker = fork_blocker(uses_gpu=uses_gpu) if method == "fork" else None
    if blocker is not None:
        if launcher == "fork":
            raise RuntimeError(f"launcher='fork': {blocker}. Keep CUDA calls and training out of the "
                               "code before fit (torch.cuda.device_count() is safe), or use "
                               "launcher='forkserver'")
        warnings.warn(f"{blocker}: launching with {FORK_FALLBACK} instead of fork", stacklevel=5)
        method = FORK_FALLBACK
    if method in ("spawn", "forkserver"):
        check_main_guard(task, method)
    return method


_FORK_BLOCKERS = {
    1: "CUDA was already used in this process (any CUDA call, and torch.cuda.is_available() unless "
       "PYTORCH_NVML_BASED_CUDA_CHECK=1 is set, initialises it), so forked ranks cannot use the GPU",
    2: "this process already ran a backward pass on a machine with GPUs, which starts autograd's "
       "per-device threads, and a forked rank cannot run autograd after that",
}


def fork_blocker(uses_gpu: bool) -> Optional[str]:
    """Why a rank forked now could not train, or None. torch marks a fork "bad" once CUDA was
    initialised or devices counted here, or a backward started the per-device threads (where
    GPUs exist); only a child sees those marks, so a throw-away child answers by exit code."""
    if uses_gpu and torch.cuda.is_initialized():
        return _FORK_BLOCKERS[1]
    if not hasattr(os, "fork") or torch.cuda.device_count() == 0:  # NVML count: safe here
        return None
    in_bad_fork = getattr(torch._C, "_cuda_isInBadFork", lambda: False)
    with warnings.catch_warnings():  # Python 3.12 warns about forking with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the probe: look, then leave at once
        code = 1 if uses_gpu and in_bad_fork() else 0
        if code == 0:
            try:
                x = torch.ones(1, requires_grad=True)
                (2 * x).sum().backward()
            except RuntimeError:
                code = 2
        os._exit(code)
    deadline = time.monotonic() + 30.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code == 0:
                return None
            return _FORK_BLOCKERS.get(code, f"a trial fork of this process failed a backward pass (exit status "
                                            f"{code})")
        if time.monotonic() > deadline:  # no answer: let the launch itself show what happens
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def check_main_guard(task: Any = None, method: str = "spawn") -> None:
    """Refuse spawn or forkserver where ranks could not start: a script from stdin, a task
    class from an interactive session (nothing to re-import), or a script training at module
    level (each rank would train again: no ``if __name__ == "__main__":``)."""
    import __main__

    path = getattr(__main__, "__file__", None)
    if path and not os.path.exists(path):
        raise RuntimeError(f"launcher='{method}' re-imports the main script in every rank, but this one was read "
                           f"from {path}, which is no file: save the script to a file and run that, or use "
                           "launcher='fork'")
    if not path:
        if task is not None and type(task).__module__ == "__main__":
            raise RuntimeError(f"launcher='{method}' imports {type(task).__name__} in every rank, but it is defined "
                               "in an interactive session (or python -c), which ranks cannot import: define it "
                               "in a module or script file, or use launcher='fork'")
        return
    lineno = None
    for frame_info in inspect.stack(context=0):
        if frame_info.frame.f_globals is __main__.__dict__ and frame_info.function == "<module>":
            lineno = frame_info.lineno
            break
    if lineno is None:
        return
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    except (OSError, SyntaxError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            end = max(getattr(n, "end_lineno", n.lineno) for n in node.body)
            if node.body[0].lineno <= lineno <= end:
                return
    raise RuntimeError(
        f"launcher='{method}' re-imports {path} in every rank, which would start training again "
        f"there (line {lineno}). Put the code that builds the trainer and calls fit under "
        "`if __name__ == \"__main__\":`, or use launcher='fork'."
    )


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    names = [test.left, test.comparators[0]]
    has_name = any(isinstance(n, ast.Name) and n.id == "__name__" for n in names)
    has_main = any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names)
    return has_name and has_main


def thread_count() -> int:
    """OS threads of this process (0 where /proc is missing: then assume several)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0

