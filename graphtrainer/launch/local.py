"""Start this machine's ranks as local processes (fork, spawn or forkserver) and bring back
rank 0's result; :mod:`graphtrainer.launch.supervisor` watches them meanwhile."""
from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing import resource_tracker
from typing import Any, Callable, Dict, List, Optional, Sequence

# Registers torch's shared-memory reductions for tensors sent to spawned children.
import torch.multiprocessing  # noqa: F401

from .. import heartbeat
from .._compat.dgl_2_1_streams import note_fresh_rank_thread
from ..process import affinity
from ..process.parent import die_with_parent
from ..checkpoint.file import remove_partials_on_signals
from ..comm import RankInfo
from ..errors import Preempted
from ..state import TrainerConfig
from . import forkserver, leftovers, rank_stderr, stop_flag
from .base import Launcher, RankTarget
from .fork_safety import start_method, thread_count
from .lean import import_rank_modules
from .pickling import start_process
from .placement import Placement
from .preflight import prepare_graphs
from .supervisor import TERMINATE_GRACE_S, FailureChannel, Watch, WatchedService, end_all
from .threads import available_cores, set_threads

#: How ranks can be started: "fork" (inherit this process), "spawn" (fresh interpreters),
#: "forkserver" (forked from a clean server process, see :mod:`graphtrainer.launch.forkserver`).
LAUNCH_METHODS = ("fork", "spawn", "forkserver")


#: A launched rank's Ctrl-C state: "interrupted" once the first SIGINT raised KeyboardInterrupt,
#: "reporting" while the rank sends its failure to the launcher.
_sigint: Dict[str, bool] = {"interrupted": False, "reporting": False}


def _interrupt_once(signum: int, frame: Any) -> None:
    """A rank's SIGINT handler: the first raises KeyboardInterrupt (the rank unwinds, its
    ``finally`` blocks run), later ones (the launcher ends ranks with SIGINT too) and one during
    a failure's report are ignored: the rank is ending and its report must not be cut."""
    if _sigint["interrupted"] or _sigint["reporting"]:
        return
    _sigint["interrupted"] = True
    raise KeyboardInterrupt


def _child_entry(*args: Any) -> None:
    """A launched rank (:func:`_rank_main`); Ctrl-C ends it quietly: the launching process
    reports the interruption, so no rank prints a KeyboardInterrupt traceback of its own."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not an ignored or a user's SIGINT
        signal.signal(signal.SIGINT, _interrupt_once)
    try:
        _rank_main(*args)
    except KeyboardInterrupt:  # outside the fit's own reporting (starting, waiting on the fit's thread)
        sys.stdout.flush()
        sys.stderr.flush()
        # Ended by SIGINT, as the launcher then says, and now: a fit thread must not keep the rank alive.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(1)  # (not reached)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # done and reported: multiprocessing's exit must not print one


def _rank_main(
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
    stderr_conn: Any = None,
    pin_cpus: bool = False,
) -> None:
    if stderr_conn is not None:
        rank_stderr.redirect_to(stderr_conn)  # through the launcher, which keeps its last lines
    die_with_parent()
    if pin_cpus:
        affinity.pin_rank(rank, threads)
    forkserver.bind_to_launcher()  # a rank of launcher="forkserver" ends with the launching process
    heartbeat.attach(board, rank)
    _dump_stacks_on_sigusr2(os.path.join(stack_dir, f"rank{rank}.stack"))
    # Not the handlers the launching process set for itself. SIGUSR1 (an early warning) means
    # nothing outside a fit, which asks for it (graphtrainer.loop.preemption).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    remove_partials_on_signals()
    info = _rank_info(rank, world_size, listener, placement)
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            set_threads(threads)
            result = target(info, *args)
            _send(conn, ("ok", rank, result if rank == 0 else None, time.monotonic()))
        except BaseException as err:  # noqa: BLE001 - everything is reported to the parent
            outcome["failed"] = _sigint["reporting"] = True  # (a SIGINT now must not cut the report)
            try:
                kept = (err.checkpoint, err.result) if rank == 0 and isinstance(err, Preempted) else None
                _send(conn, ("error", rank, (type(err).__name__, str(err), traceback.format_exc(), kept),
                             time.monotonic()))
            except Exception:  # noqa: BLE001 - the pipe itself may be gone
                pass

    # Started with the stop signals blocked, routed (main thread) then unblocked: kept for the fit.
    with stop_flag.routed(keep=True):
        if fresh_thread:
            note_fresh_rank_thread()  # fresh OpenMP state (a reused pool hangs), a DGL stream after the parent's
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


def _dump_stacks_on_sigusr2(path: str) -> None:
    """The launcher sends SIGUSR2 to a rank it finds stuck and reads the stack from ``path``
    (SIGUSR1 is Slurm's early warning: see graphtrainer.loop.preemption)."""
    stack_file = open(path, "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.register(signal.SIGUSR2, file=stack_file, all_threads=True)


def _rank_info(rank: int, world_size: int, listener: socket.socket, placement: Optional[Placement]) -> RankInfo:
    """Where this launched rank sits: on this machine alone, rendezvous on the listener the
    parent bound (rank 0's store takes it over); in a job over several machines, at the
    placement's global rank and rendezvous."""
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
    return info


def _send(conn: Any, message: tuple) -> None:
    # Plain pickle, not multiprocessing's: that one passes tensors as shared-memory file
    # descriptors, which vanish when this process exits right after sending.
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


#: Why a forked rank could not train, by the probe's exit code.
@leftovers.unwinds_on_sigterm
def launch(
    target: Callable[..., Any],
    args: Sequence[Any],
    world_size: int,
    method: str,
    threads_per_proc: int,
    hang_timeout: Optional[float] = None,
    placement: Optional[Placement] = None,
    services: Sequence[WatchedService] = (),
    job: Optional[FailureChannel] = None,
    pin_cpus: bool = False,
) -> Any:
    """Run ``target(RankInfo, *args)`` on ``world_size`` new processes; return rank 0's result.

    Long because starting, watching and always reaping the ranks share one ``try``/
    ``finally`` that ends every child, whatever happened.

    Raises :class:`RankFailedError` for the first rank that fails, or for the ranks that
    made no progress for ``hang_timeout`` seconds (None: never); no child outlives the call.
    With ``placement`` the processes are this machine's share of a larger job (and the
    result is that of its first rank); a failed ``services`` process ends the run too, and
    ``job`` carries failures between machines (closed here). ``pin_cpus``: each rank on its own
    ``threads_per_proc`` cores (:mod:`graphtrainer.process.affinity`).
    """
    if method not in LAUNCH_METHODS:
        raise ValueError(f"launch method {method!r}: choose one of {LAUNCH_METHODS}")
    ctx = forkserver.context() if method == "forkserver" else mp.get_context(method)
    # Only a fork inherits the parent's OpenMP state, only a parent with threads besides
    # its main one can have an OpenMP pool whose state would hang the rank, and a rank
    # limited to one thread never enters that pool. Otherwise ranks stay in their main
    # thread: DGL picks each thread's random stream by the order in which threads first
    # used its generator in the process, and a forked main thread keeps the parent's
    # (first) one, while a fresh thread's would depend on what the parent did before fit.
    fresh_thread = method == "fork" and threads_per_proc > 1 and thread_count() != 1
    procs: List[mp.process.BaseProcess] = []
    conns: Dict[int, Any] = {}
    err_conns: Dict[int, Any] = {}
    relay: Optional[rank_stderr.StderrRelay] = None
    watch: Optional[Watch] = None
    listener: Optional[socket.socket] = None
    stack_dir: Optional[str] = None
    succeeded = False
    # Everything from here inside the try: a stop signal before the first rank (Preempted, or
    # SystemExit outside a fit) still stops the fork server and removes the stacks folder.
    try:
        if method == "forkserver":
            forkserver.start_server()  # no-op when prepare_graphs already started it
        if method == "spawn":
            # Started here, not inside the first rank's start: starting it unblocks SIGTERM in this thread.
            resource_tracker.ensure_running()
        # The rendezvous socket: bound here, on loopback, and handed to rank 0's store.
        listener = socket.create_server(("127.0.0.1", 0), backlog=max(128, world_size))
        board = heartbeat.new_board(ctx, world_size)
        leftovers.remove_dead_owners(("stacks", "ipconfig"))
        with leftovers.stop_signals_held():  # made and named before a stop signal acts
            stack_dir = leftovers.owned_temp_dir("stacks")
        if method == "fork":
            import_rank_modules()  # once here, shared by every rank, instead of once per rank
            gc.freeze()  # collector passes in a rank would otherwise copy every inherited object's page
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            err_conns[rank], err_send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child_entry,
                args=(rank, world_size, listener, send, target, args, threads_per_proc, fresh_thread,
                      board, stack_dir, placement, err_send, pin_cpus),
                name=f"graphtrainer-rank{rank}",
                daemon=False,
            )
            try:
                with stop_flag.blocked():  # inherited: the rank unblocks them once it routes them
                    try:
                        start_process(proc, method, args)
                    except BaseException:
                        recv.close()
                        raise
                    procs.append(proc)
                    conns[rank] = recv
                    # Before the unblock: a stop signal held meanwhile goes to this rank, which keeps it.
                    leftovers.forward_stop_signals_to(proc.pid)
            finally:
                send.close()
                err_send.close()
        listener.close()
        if method == "fork":
            gc.unfreeze()
        if method == "forkserver":
            services = [*services, forkserver.ServerWatch(procs)]
        relay = rank_stderr.StderrRelay(err_conns)  # once every rank is forked: no thread to fork
        watch = Watch(procs, conns, method, board, hang_timeout, stack_dir, placement, services, job)
        watch.relay = relay
        result = watch.run()
        succeeded = True
        return result
    finally:
        if listener is not None:
            listener.close()
        with leftovers.cleanup_first():  # a second Ctrl-C waits for it
            _clean_up(procs, conns, err_conns, relay, method, stack_dir, job, succeeded,
                      watch.end_grace_s if watch is not None else TERMINATE_GRACE_S)


def _clean_up(procs: List[Any], conns: Dict[int, Any], err_conns: Dict[int, Any],
              relay: Optional[rank_stderr.StderrRelay], method: str, stack_dir: Optional[str],
              job: Optional[FailureChannel], succeeded: bool, grace_s: float) -> None:
    """End every rank and the fork server, close the pipes, remove the stacks folder."""
    gc.unfreeze()
    if job is not None:
        job.close()  # (the watch closes it too; closing twice is harmless)
    try:
        # After success the ranks are only tearing down: give them time to exit.
        end_all(procs, wait_s=30.0 if succeeded else 0.0, grace_s=grace_s)
    finally:
        if method == "forkserver":
            forkserver.stop_server()  # no server outlives the launch
    if relay is not None:
        relay.close()  # the ranks are gone: what they wrote last is copied out
    else:
        for conn in err_conns.values():
            conn.close()
    for conn in conns.values():
        conn.close()
    for proc in procs:
        proc.close()  # its sentinel pipe, now rather than at garbage collection
    if stack_dir is not None:
        shutil.rmtree(stack_dir, ignore_errors=True)


class LocalLauncher(Launcher):
    """This machine's ranks as new local processes (fork, spawn or forkserver): the start
    method is chosen (and refused where ranks could not start) when the launcher is made;
    :meth:`run` prepares the task's graphs for it, then starts and watches the ranks."""

    def __init__(self, config: TrainerConfig, task: Any):
        self.config, self.task = config, task
        self.method = start_method(config.launcher, bool(config.device_ids), task)

    def run(self, target: RankTarget, args: Sequence[Any]) -> Any:
        return self.start(target, args)

    def start(self, target: RankTarget, args: Sequence[Any], placement: Optional[Placement] = None,
              services: Sequence[WatchedService] = (), job: Optional[FailureChannel] = None) -> Any:
        """:func:`launch` with the trainer's options; ``placement``, ``services`` and ``job``
        for a machine's share of a job over several machines."""
        config = self.config
        prepare_graphs(self.task, self.method)
        threads = config.threads_per_proc or max(1, available_cores() // config.num_procs)
        return launch(target, args, config.num_procs, self.method, threads, config.hang_timeout,
                      placement=placement, services=services, job=job, pin_cpus=config.pin_cpus)
