"""A DistDGL run as one launcher: this machine's graph servers, then its ranks, each joining
the servers before its process group. ``Trainer`` uses it when :func:`distgraph_options` finds
a DistDGL run; nothing else in the engine knows about DistDGL.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from .. import heartbeat
from ..comm import RankInfo
from ..launch.base import Launcher, RankTarget
from ..launch import leftovers
from ..launch.environment import one_process_per_machine
from ..launch.local import LocalLauncher
from ..loop.context import RankContext
from ..state import TrainerConfig
from . import graph as dist_graph
from . import job_failures
from .cluster import Cluster, DistGraphOptions, check_options, resolve_cluster, written_ip_config
from .graph import PartitionedGraph
from .servers import graph_servers


def distgraph_options(config: TrainerConfig, task: Any, dist_args: Tuple[Any, ...]) -> Optional[DistGraphOptions]:
    """The trainer's DistDGL options, or the task's ``PartitionedGraph`` with ``dist_args``
    (ip_config, num_servers, machine_rank); None for other runs."""
    held = getattr(task, "graph", None)
    options = config.distgraph
    if options is not None and held is not None and not isinstance(held, PartitionedGraph):
        raise ValueError(f"distributed_graph={options.part_config!r} trains on the partitioned graph, but the "
                         f"task holds an in-memory graph ({type(held).__name__}), from which it may have taken "
                         "node ids: partitioning numbers nodes differently. Build the task on "
                         "PartitionedGraph(<partition config>) (graphtrainer.distdgl.graph), or leave task.graph "
                         "None and read the DistGraph in setup()")
    if isinstance(held, PartitionedGraph):
        if options is None:
            return check_options(held.part_config, *dist_args)
        if options.part_config != held.part_config:
            raise ValueError(f"distributed_graph={options.part_config!r} but the task's graph is "
                             f"{held.part_config!r}: give one of them")
    return options


class DistDGLLauncher(Launcher):
    """This machine's share of a DistDGL run: its graph servers, then its ranks. Machine 0's
    launcher makes the run folder; every rank learns it from rank 0."""

    run_dir_from_rank0 = True

    def __init__(self, config: TrainerConfig, task: Any, options: DistGraphOptions):
        if one_process_per_machine() is not None:
            raise RuntimeError(f"distributed_graph= runs one process per machine, which starts that machine's "
                               f"graph servers and trainer ranks, but {one_process_per_machine()}: start "
                               "the script once per machine (under Slurm: srun --ntasks-per-node=1)")
        self.cluster = resolve_cluster(options, config.num_procs)
        self.makes_run_dir = self.cluster.machine_rank == 0
        self.local = LocalLauncher(config, task)

    @leftovers.unwinds_on_sigterm  # outside the servers' block: SIGTERM stops the ranks, which checkpoint
    def run(self, target: RankTarget, args: Sequence[Any]) -> Any:
        placement = self.cluster.placement()
        with written_ip_config(self.cluster) as cluster, graph_servers(cluster) as servers:
            return self.local.start(target, (*args, DistRankSession(cluster)), placement=placement,
                                    services=servers, job=job_failures.for_placement(placement))


class DistRankSession:
    """A DistDGL rank around the runtime (``graphtrainer.loop.runtime.RankSession``): join the
    servers before the process group, give the task the ``DistGraph``, leave after success."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def before_group(self, info: RankInfo) -> None:
        with heartbeat.waiting("graph servers"):
            dist_graph.connect(self.cluster, info.local_rank)

    def attach(self, ctx: RankContext) -> None:
        ctx.task.graph = dist_graph.open_graph(self.cluster)

    def after_success(self) -> None:
        with heartbeat.waiting("graph servers"):
            dist_graph.disconnect()  # every rank, after success only
