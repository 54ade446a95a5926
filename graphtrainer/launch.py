"""Start one process per rank, watch them, and bring back rank 0's result.

The parent never blocks on a queue alone: it waits on every child's result pipe and
process sentinel together, so a rank that dies without a word (SIGKILL, a C++ abort)
is noticed at once. On the first failure the other ranks are ended (SIGTERM, then
SIGKILL) and one :class:`RankFailedError` names the failing rank and carries its
traceback.
"""
from __future__ import annotations

import ast
import ctypes
import faulthandler
import gc
import inspect
import io
import linecache
import multiprocessing as mp
import os
import pickle
import signal
import socket
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
# Registers torch's shared-memory reductions for tensors sent to spawned children.
import torch.multiprocessing  # noqa: F401

from . import forkserver, heartbeat
from .checkpoint_file import remove_partials_on_signals
from .distributed import RankInfo
from .job_failures import JobFailures
from .lean import import_rank_modules
from .threads import set_threads

#: How ranks can be started: "fork" (inherit this process), "spawn" (fresh interpreters),
#: "forkserver" (forked from a clean server process, see :mod:`graphtrainer.forkserver`).
LAUNCH_METHODS = ("fork", "spawn", "forkserver")
#: Where fork is unsafe (CUDA or autograd threads already started here), what "auto" uses.
FORK_FALLBACK = "forkserver"

#: Seconds a rank gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 3.0
#: After the first failure, seconds to wait for other reports before naming the cause.
FAILURE_SETTLE_S = 1.0
#: Over several machines, how long a failure waits for another machine's report of its cause.
OTHER_MACHINE_SETTLE_S = 4.0
#: Ranks finish together (the run ends with a barrier): once one has reported its result,
#: a rank still silent after this many seconds is hung and is ended.
FINISH_SKEW_S = 60.0
#: A rank that has not reported progress yet (still importing, unpickling) gets at least this long.
STARTUP_TIMEOUT_S = 120.0
#: Seconds to wait for a stuck rank's stack dump.
STACK_DUMP_WAIT_S = 3.0


class RankFailedError(RuntimeError):
    """A rank raised, or died. ``rank``, ``error_type``, ``message`` and ``remote_traceback`` say how.

    On a run over several machines ``machine`` names the machine (its rank and address);
    a failed graph server (see :mod:`graphtrainer.graph_servers`) has ``rank`` -1 and
    ``process`` naming it.
    """

    def __init__(self, rank: int, error_type: str, message: str, remote_traceback: str = "",
                 ranks: Optional[List[int]] = None, machine: Optional[str] = None,
                 process: Optional[str] = None):
        self.rank = rank
        #: Every rank blamed (a hang can stop several); ``rank`` is the first of them.
        self.ranks = ranks if ranks is not None else [rank]
        self.error_type = error_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.machine = machine
        #: True when another machine's launcher reported it (this machine's ranks were stopped).
        self.elsewhere = False
        #: What failed, in words: "rank 3 on machine 1 (10.0.0.2)", "graph server 0 ...".
        self.process = process or f"rank {rank}" + (f" on machine {machine}" if machine else "")
        text = f"{self.process} failed: {error_type}: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback from {self.process} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self) -> Any:
        return (_rebuild_failure, (self.rank, self.error_type, self.message, self.remote_traceback, self.ranks,
                                   self.machine, self.process))


def _rebuild_failure(*args: Any) -> "RankFailedError":
    return RankFailedError(*args)


@dataclass(frozen=True)
class Placement:
    """Where this machine's launched ranks sit in a job over several machines.

    Rank ``first_rank + i`` is the ``i``-th process started here; the ranks of all
    machines rendezvous at ``master_addr:master_port`` (rank 0's store, on machine 0),
    and gloo talks over ``socket_ifname``.
    """

    first_rank: int
    world_size: int
    #: None: this machine alone, on the launcher's own loopback rendezvous.
    master_addr: Optional[str]
    master_port: int
    socket_ifname: Optional[str]
    machine: str  # "<machine rank> (<address>)", for error messages


class WatchedService:
    """A helper process the ranks depend on (a graph server): its death ends the run."""

    def failure(self) -> Optional[RankFailedError]:
        """The error to raise when the process has failed, else None."""
        raise NotImplementedError


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits, so no rank is orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_entry(
    rank: int,
    world_size: int,
    listener: socket.socket,
    conn: Any,
    target: Callable[..., Any],
    args: Sequence[Any],
    threads: int,
    fresh_thread: bool,
    board: Any,
    stack_dir: str,
    placement: Optional[Placement] = None,
) -> None:
    _die_with_parent()
    heartbeat.attach(board, rank)
    # The launcher sends SIGUSR1 to a rank it finds stuck and reads the stack from here.
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler the launching process set for itself
    remove_partials_on_signals()
    if placement is None or placement.master_addr is None:
        port = listener.getsockname()[1]
        listen_fd = listener.detach() if rank == 0 else None  # rank 0's store owns it from now on
        listener.close()
        if sys.platform.startswith("linux") and any(name == "lo" for _, name in socket.if_nameindex()):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own sockets: loopback too
        info = RankInfo(rank=rank, local_rank=rank, world_size=world_size, master_addr="127.0.0.1",
                        master_port=port, source="launcher", listen_fd=listen_fd)
    else:
        assert placement.master_addr is not None
        if placement.socket_ifname:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", placement.socket_ifname)
        info = RankInfo(rank=placement.first_rank + rank, local_rank=rank, world_size=placement.world_size,
                        master_addr=placement.master_addr, master_port=placement.master_port,
                        source="launcher")
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            set_threads(threads)
            result = target(info, *args)
            _send(conn, ("ok", rank, result if rank == 0 else None, time.monotonic()))
        except BaseException as err:  # noqa: BLE001 - everything is reported to the parent
            outcome["failed"] = True
            try:
                _send(conn, ("error", rank, (type(err).__name__, str(err), traceback.format_exc()),
                             time.monotonic()))
            except Exception:  # noqa: BLE001 - the pipe itself may be gone
                pass

    if fresh_thread:
        # A fresh thread starts with fresh OpenMP state: a forked child that reuses the
        # parent's OpenMP thread pool hangs at its first parallel region (a
        # 2-rank fork after OpenMP use in the parent sat idle forever).
        worker = threading.Thread(target=run, name=f"graphtrainer-rank{rank}")
        worker.start()
        worker.join()
    else:
        run()
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    if outcome.get("failed"):
        os._exit(1)


def _send(conn: Any, message: tuple) -> None:
    # Plain pickle, not multiprocessing's: that one passes tensors as shared-memory file
    # descriptors, which vanish when this process exits right after sending.
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


#: Why a forked rank could not train, by the probe's exit code.
_FORK_BLOCKERS = {
    1: "CUDA was already used in this process (any CUDA call, and torch.cuda.is_available() unless "
       "PYTORCH_NVML_BASED_CUDA_CHECK=1 is set, initialises it), so forked ranks cannot use the GPU",
    2: "this process already ran a backward pass on a machine with GPUs, which starts autograd's "
       "per-device threads, and a forked rank cannot run autograd after that",
}


def fork_blocker(uses_gpu: bool) -> Optional[str]:
    """Why a rank forked now could not train, or None when it can.

    torch marks a fork "bad" for CUDA once this process initialised CUDA or asked the CUDA
    runtime for a device count, and "bad" for autograd once a backward pass started the
    per-device threads (only where GPUs exist; CPU ranks then fail at their first
    backward). Only a forked child can see those marks, so a throw-away child is forked
    to look and answers with its exit code.
    """
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
    """Refuse spawn or forkserver where its ranks could not start: a script read from stdin
    (nothing to re-import), a task class defined in an interactive session (nothing to
    import it from), or a script that calls the trainer at module level (each rank would
    start training again, having re-imported it without ``if __name__ == "__main__":``)."""
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


def launch(
    target: Callable[..., Any],
    args: Sequence[Any],
    world_size: int,
    method: str,
    threads_per_proc: int,
    hang_timeout: Optional[float] = None,
    placement: Optional[Placement] = None,
    services: Sequence[WatchedService] = (),
) -> Any:
    """Run ``target(RankInfo, *args)`` on ``world_size`` new processes; return rank 0's result.

    Raises :class:`RankFailedError` for the first rank that fails, or for the ranks that
    made no progress for ``hang_timeout`` seconds (None: never); no child outlives the call.
    With ``placement`` the processes are this machine's share of a larger job (and the
    result is that of its first rank); a failed ``services`` process ends the run too.
    """
    if method not in LAUNCH_METHODS:
        raise ValueError(f"launch method {method!r}: choose one of {LAUNCH_METHODS}")
    if method == "forkserver":
        ctx = forkserver.context()
        forkserver.start_server()  # no-op when prepare_graphs already started it
    else:
        ctx = mp.get_context(method)
    # Only a fork inherits the parent's OpenMP state, only a parent with threads besides
    # its main one can have an OpenMP pool whose state would hang the rank, and a rank
    # limited to one thread never enters that pool. Otherwise ranks stay in their main
    # thread: DGL picks each thread's random stream by the order in which threads first
    # used its generator in the process, and a forked main thread keeps the parent's
    # (first) one, while a fresh thread's would depend on what the parent did before fit.
    fresh_thread = method == "fork" and threads_per_proc > 1 and _thread_count() != 1
    procs: List[mp.process.BaseProcess] = []
    conns: Dict[int, Any] = {}
    succeeded = False
    # The rendezvous socket: bound here, on loopback, and handed to rank 0's store.
    listener = socket.create_server(("127.0.0.1", 0), backlog=max(128, world_size))
    board = heartbeat.new_board(ctx, world_size)
    stack_dir = tempfile.mkdtemp(prefix="graphtrainer-stacks-")
    if method == "fork":
        import_rank_modules()  # once here, shared by every rank, instead of once per rank
        gc.freeze()  # collector passes in a rank would otherwise copy every inherited object's page
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child_entry,
                args=(rank, world_size, listener, send, target, args, threads_per_proc, fresh_thread,
                      board, stack_dir, placement),
                name=f"graphtrainer-rank{rank}",
                daemon=False,
            )
            try:
                _start(proc, method, args)
            except BaseException:
                recv.close()
                raise
            finally:
                send.close()
            procs.append(proc)
            conns[rank] = recv
        listener.close()
        if method == "fork":
            gc.unfreeze()
        watch = _Watch(procs, conns, method, board, hang_timeout, stack_dir, placement, services)
        result = watch.run()
        succeeded = True
        return result
    finally:
        listener.close()
        gc.unfreeze()
        try:
            # After success the ranks are only tearing down: give them time to exit.
            _end_all(procs, wait_s=30.0 if succeeded else 0.0)
        finally:
            if method == "forkserver":
                forkserver.stop_server()  # no server outlives the launch
        for conn in conns.values():
            conn.close()
        for proc in procs:
            proc.close()  # its sentinel pipe, now rather than at garbage collection
        shutil.rmtree(stack_dir, ignore_errors=True)


def _start(proc: Any, method: str, args: Sequence[Any]) -> None:
    """Start ``proc``; under spawn, name what could not be pickled."""
    try:
        proc.start()
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        if method == "fork":
            raise
        culprit = _find_unpicklable(args)
        raise RuntimeError(
            f"launcher='{method}' must pickle the trainer and the task to send them to each rank, but "
            f"{culprit or 'something they hold'} cannot be pickled ({type(err).__name__}: {err}). Create "
            "such objects in setup() or configure_model(), which run in each rank, or use "
            "launcher='fork', which pickles nothing.") from err


def _find_unpicklable(args: Sequence[Any]) -> Optional[str]:
    """``task.<attr>`` (or ``trainer.<attr>``, one level deeper where it helps) that fails to pickle."""
    from multiprocessing.reduction import ForkingPickler

    for label, obj in (("task", args[1] if len(args) > 1 else None), ("trainer", args[0] if args else None)):
        if obj is None or not hasattr(obj, "__dict__"):
            continue

        class _OwnerKept(ForkingPickler):
            # References back to the object searched (a metric store's owner, say) count as
            # picklable: the culprit is what fails on its own.
            def persistent_id(self, value: Any) -> Optional[str]:
                return "owner" if value is obj else None

        def fails(value: Any) -> bool:
            try:
                _OwnerKept(io.BytesIO()).dump(value)
                return False
            except Exception:  # noqa: BLE001 - any failure to pickle
                return True

        for name, value in vars(obj).items():
            if not fails(value):
                continue
            inner = vars(value).items() if hasattr(value, "__dict__") else ()
            deeper = next((f"{label}.{name}.{sub} ({type(v).__name__})" for sub, v in inner if fails(v)), None)
            return deeper or f"{label}.{name} ({type(value).__name__})"
    return None


def _thread_count() -> int:
    """OS threads of this process (0 where /proc is missing: then assume several)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


class _Watch:
    """The launcher's view of its ranks until rank 0's result arrives or one fails."""

    def __init__(self, procs: List[Any], conns: Dict[int, Any], method: str, board: Any,
                 hang_timeout: Optional[float], stack_dir: str, placement: Optional[Placement] = None,
                 services: Sequence[WatchedService] = ()):
        self.procs, self.method, self.board = procs, method, board
        self.placement, self.services = placement, list(services)
        self.job = None  # over several machines: failures the other machines report, and ours for them
        if placement is not None and placement.master_addr is not None:
            self.job = JobFailures(placement.master_addr, placement.master_port + 1, serve=placement.first_rank == 0)
        self.hang_timeout, self.stack_dir = hang_timeout, Path(stack_dir)
        self.open_conns = dict(conns)
        self.results: Dict[int, Any] = {}
        self.failures: List[tuple] = []  # (time, RankFailedError)

    def run(self) -> Any:
        try:
            return self._run()
        finally:
            if self.job is not None:
                self.job.close()

    def _run(self) -> Any:
        deadline = None  # once a rank fails, peers get a moment to report, then we pick the cause
        first_done: Optional[float] = None
        procs = self.procs
        while len(self.results) < len(procs):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self.results and first_done is None:
                first_done = time.monotonic()
            if first_done is not None and not self.failures and time.monotonic() - first_done > FINISH_SKEW_S:
                self._finish_skew()
                break
            waitables = list(self.open_conns.values()) + [p.sentinel for r, p in enumerate(procs)
                                                          if r not in self.results and p.exitcode is None]
            if not waitables:
                if deadline is None or self.job is None:
                    break
                time.sleep(0.1)  # nothing left here to wait on; another machine may still say why
            if self._check_other_machines() and deadline is not None:
                deadline = min(deadline, time.monotonic() + FAILURE_SETTLE_S)  # the cause is known
            for ready in wait(waitables, timeout=0.2 if deadline else 1.0):
                rank = next((r for r, c in self.open_conns.items() if c is ready), None)
                if rank is not None:
                    self._receive(rank)
            self._reap_dead()
            self._check_services()
            if not self.failures and self.hang_timeout is not None:
                self._check_hang()
            if self.failures and deadline is None:
                deadline = time.monotonic() + self._settle_s()
            self._report_cause()
        if self.failures:
            cause = self._placed(min(self.failures, key=_cause_order)[1])
            if self.job is not None and not cause.elsewhere:
                self.job.report(cause.rank, cause.machine, cause.error_type, cause.message)
            raise cause
        return self.results[0]

    def _report_cause(self) -> None:
        """Tell the other machines at once when a failure here is a cause (not a lost peer):
        their ranks may be stuck waiting on ours."""
        if self.job is None:
            return
        causes = [f for f in self.failures if _cause_order(f)[0] < 2 and not f[1].elsewhere]
        if causes:
            cause = self._placed(min(causes, key=_cause_order)[1])
            self.job.report(cause.rank, cause.machine, cause.error_type, cause.message)

    def _settle_s(self) -> float:
        """How long to wait for other reports once a failure is in: longer over several
        machines, where what failed here may follow from a failure elsewhere (a lost peer,
        a C++ abort in a collective) and that machine will say so."""
        if self.job is not None and not any(f[1].elsewhere for f in self.failures):
            return OTHER_MACHINE_SETTLE_S
        return FAILURE_SETTLE_S

    def _check_other_machines(self) -> bool:
        """True once another machine has reported a failure (added to ours)."""
        reported = self.job.reported() if self.job is not None else None
        if reported is None:
            return False
        if any(f[1].elsewhere for f in self.failures):
            return True
        err = RankFailedError(reported["rank"], reported["error_type"],
                              f"{reported['message']} (this machine's ranks were stopped)", machine=reported["machine"])
        err.elsewhere = True
        self.failures.append((time.monotonic(), err))
        return True

    def _check_services(self) -> None:
        for service in self.services:
            failure = service.failure()
            if failure is not None and all(f[1] is not failure for f in self.failures):
                self.failures.append((time.monotonic(), failure))
                self.services.remove(service)  # reported once

    def _placed(self, err: RankFailedError) -> RankFailedError:
        """``err`` with global rank numbers and the machine, on a job over several machines."""
        if self.placement is None or err.rank < 0 or err.elsewhere:
            return err
        offset = self.placement.first_rank  # (a hang's message counts this machine's ranks from 0)
        return RankFailedError(err.rank + offset, err.error_type, err.message, err.remote_traceback,
                               [r + offset for r in err.ranks], machine=self.placement.machine)

    def _failed(self, rank: int) -> bool:
        return any(f[1].rank == rank for f in self.failures)

    def _reap_dead(self) -> None:
        for rank, proc in enumerate(self.procs):
            if rank in self.results or proc.exitcode is None or self._failed(rank):
                continue
            # The process ended: read whatever it managed to send before concluding.
            while rank in self.open_conns and self.open_conns[rank].poll():
                self._receive(rank)
            if rank not in self.results and not self._failed(rank):
                self.failures.append((time.monotonic(), _died(rank, proc.exitcode, self.method)))

    def _receive(self, rank: int) -> None:
        try:
            kind, _, payload, stamp = pickle.loads(self.open_conns[rank].recv_bytes())
        except (EOFError, OSError):
            self.open_conns.pop(rank).close()
            return
        if kind == "ok":
            self.results[rank] = payload
        else:
            err_type, message, tb = payload
            self.failures.append((stamp, RankFailedError(rank, err_type, message, tb)))

    def _finish_skew(self) -> None:
        done = sorted(self.results)
        for rank in range(len(self.procs)):
            if rank not in self.results:
                self.failures.append((time.monotonic(), RankFailedError(
                    rank, "Hang", f"rank {rank} did not finish within {FINISH_SKEW_S:.0f} s after "
                    f"rank(s) {done} finished; it was stopped")))

    def _check_hang(self) -> None:
        assert self.hang_timeout is not None
        running = [r for r, p in enumerate(self.procs) if r not in self.results and p.exitcode is None]
        places = heartbeat.read_board(self.board, len(self.procs))
        stuck = heartbeat.find_stuck(places, self.hang_timeout, max(self.hang_timeout, STARTUP_TIMEOUT_S),
                                     running)
        if stuck is None:
            return
        blamed = [p.rank for p in stuck]
        stacks = self._dump_stacks(blamed)
        others = [p.describe() for p in places if p.rank in running and p.rank not in blamed]
        lines = [p.describe() for p in stuck]
        message = (f"no progress for {self.hang_timeout:g} s (Trainer(hang_timeout=...)): "
                   + "; ".join(lines) + "." + (f" Waiting for it: {'; '.join(others)}." if others else ""))
        if any(p.place == "graph servers" for p in stuck):
            message += (" DGL's clients wait for the graph servers of every machine of ip_config, and each "
                        "server for every machine's ranks: is the script running on every machine, with the "
                        "same ip_config, and are the ports of ip_config open between the machines?")
        self.failures.append((time.monotonic(), RankFailedError(blamed[0], "Hang", message, stacks, blamed)))

    def _dump_stacks(self, ranks: List[int]) -> str:
        """Every blamed rank's Python stack (faulthandler), with each frame's source line."""
        files = {r: self.stack_dir / f"rank{r}.stack" for r in ranks}
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        sizes: Dict[int, int] = {}
        while time.monotonic() < deadline:
            now = {r: f.stat().st_size if f.exists() else 0 for r, f in files.items()}
            if all(now.values()) and now == sizes:
                break
            sizes = now
            time.sleep(0.1)
        parts = []
        for rank, path in files.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"rank {rank}:\n" + (_with_source(text) or "(no stack: the rank did not answer SIGUSR1)"))
        return "\n\n".join(parts)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def _with_source(dump: str) -> str:
    """faulthandler's dump with the source text under each frame, as in a traceback."""
    out = []
    for line in dump.splitlines():
        out.append(line)
        match = _FRAME.match(line)
        if match:
            source = linecache.getline(match["file"], int(match["line"])).strip()
            if source:
                out.append(f"    {source}")
    return "\n".join(out)


def _cause_order(failure: tuple) -> tuple:
    """Which failure caused the others: a rank that died on its own (it cannot report, so
    its peers' connection errors arrive first), then a real exception, then peers' errors
    about the lost connection; earliest first within each."""
    stamp, err = failure
    if err.rank < 0 or err.elsewhere:  # a graph server or another machine: the
        kind = -1                                            # ranks' errors here follow from that
    elif err.error_type == "ProcessDied":
        kind = 0
    elif _is_peer_loss(err):
        kind = 2
    else:
        kind = 1
    return kind, stamp


def _is_peer_loss(err: RankFailedError) -> bool:
    text = f"{err.error_type} {err.message}".lower()
    return any(mark in text for mark in ("gloo", "nccl", "connection reset", "connection closed",
                                          "broken pipe", "distbackenderror", "timed out"))


def _died(rank: int, exitcode: int, method: str) -> RankFailedError:
    if exitcode < 0:
        how = f"killed by signal {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with code {exitcode} before reporting a result"
    hint = ""
    if method in ("spawn", "forkserver") and exitcode > 0:
        hint = (f" With launcher='{method}' a rank that dies at start often could not import the "
                "script: check that it guards its entry point with `if __name__ == \"__main__\":`"
                " and that the task's class is importable.")
    return RankFailedError(rank, "ProcessDied", how + "." + hint)


def _end_all(procs: List[Any], wait_s: float) -> None:
    """Give children ``wait_s`` to exit, terminate the rest, then reap all of them."""
    _join_all(procs, wait_s)
    for proc in procs:
        if proc.exitcode is None:
            proc.terminate()
    _join_all(procs, TERMINATE_GRACE_S)
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join(timeout=5.0)


def _join_all(procs: List[Any], seconds: float) -> None:
    """Wait up to ``seconds`` in all for every process to exit."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
