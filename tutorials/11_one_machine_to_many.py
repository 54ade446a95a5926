"""Tutorial 11: from one machine to many. The same GraphTask on DistDGL: partition, one machine, several.

What you will see: tutorial 1's task (``NodeClassification``, GraphSAGE on Cora with
tutorial 1's settings: hidden 128, dropout 0.6, lr 0.005, weight decay 5e-4, batch 32,
fanouts 10,10) trained on DistDGL, DGL's distributed graph, in three steps:

1. **Partition** the graph once, into one part per machine.
2. **One machine, one partition**: the task built from the partition folder alone, trained
   by ``Trainer(num_procs=2)``; then the same task in memory, for comparison.
3. **Several machines**: the same training script on each machine, started by hand
   (no ssh needed) or by Slurm; and here, on simulated machines (``--simulate N``).

The task and the trainer do not change from step to step: what changes is where the
graph lives. In memory every rank reads the whole graph. On DistDGL each machine runs
*graph servers* that hold its partition (structure and node features) in shared memory;
the ranks sample their batches and fetch their features from them, locally from shared
memory, over the network for nodes another machine owns. A graph bigger than one machine
fits in the memory of several.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time)::

    bash scripts/env.sh python tutorials/11_one_machine_to_many.py               # steps 1 and 2
    bash scripts/env.sh python tutorials/11_one_machine_to_many.py --simulate 2  # step 3 (root)

Step 1: partition
-----------------
::

    python -m graphtrainer.cli.partition --dataset cora --parts K --out parts/cora-Kparts

(this script calls the same command line, ``graphtrainer.cli.partition.main([...])``; its
Python API is ``graphtrainer.distdgl.partition.partition_graph(graph, name, parts, out)``). It
wraps ``dgl.distributed.partition_graph`` (METIS, balancing the training nodes over the
parts) and prints one row per part: the nodes it owns, its *halo* nodes (copies of
neighbours another part owns, so that one hop of sampling stays local), the edges it
owns, its training nodes, its size on disk, and the edge cut. It writes, in ``--out``:
``cora.json`` (DGL's partition config: the file every machine is given), ``part0/`` ...
``part<K-1>/`` (one per machine), and graphtrainer's ``cora.meta.json`` (sizes, feature
shapes, number of classes: what the task needs before any graph is opened) and
``cora.orig_ids.pt`` (DGL renumbers the nodes so that each part's own nodes are one
range of ids; ``t[i]`` is the original id of node ``i``).

Step 2: one machine, one partition
----------------------------------
::

    task = NodeClassification("parts/cora-1part/cora.json", **settings)   # a PartitionedGraph
    trainer = Trainer(num_procs=2, max_epochs=40, callbacks=[...])
    trainer.fit(task); trainer.test(task, ckpt_path="best")

Given the path of a partition config, the task holds a ``PartitionedGraph``
(``graphtrainer.distdgl.graph``): a light handle that reads the feature size and the number
of classes from ``cora.meta.json``; nothing else is loaded in this process. Seeing it,
``fit`` runs on DistDGL without further options (``Trainer(distributed_graph="parts/...")``
does the same for a task whose graph is not a ``PartitionedGraph``): it writes a one-line
ip_config on loopback, starts the machine's graph server (a fresh interpreter that loads
``part0`` into ``/dev/shm``), forks the 2 ranks, and in each rank replaces ``task.graph``
with the opened ``dgl.distributed.DistGraph``. ``node_dataloader`` then gives
``DistNodeLoader`` batches over the machine's own masked nodes (``train_mask`` is a
``DistTensor`` there), split between its ranks, reshuffled every epoch; validation and
test score every node once and reduce exactly, as in memory (500 and 1,000 nodes). At the
end the ranks ask the server to shut down; on a failure the trainer stops it. No process
and no shared-memory segment outlive the call.

The in-memory run is ``NodeClassification(datasets.load("cora"), **settings)``: tutorial
1's run (it prints the same epochs and test accuracy). The two reach about the same
accuracy but are not the same run: DGL renumbers the nodes, so the ranks get other
batches and other sampled neighbours. Each is repeatable: a second run prints the same
numbers.

The price on one machine is start-up: each ``fit``, ``test`` or ``predict`` call starts
the graph server again and waits for it (an interpreter importing DGL and loading the
partition; DGL's client retries its connection every 3 s until the server listens):
seconds per call, against a fraction of a second in memory (compare the ``fit`` and
``test`` seconds the two runs print). The epochs themselves cost about the same.

Step 3: several machines
------------------------
One partition per machine: partition with ``--parts`` = the number of machines. Each
machine runs *one* process, the same command everywhere; that process starts the
machine's graph servers (``--num-servers``, default 1) and its ``--num-procs`` trainer
ranks. The ranks of all machines form one job: rank ``m * num_procs + i`` is rank ``i``
of machine ``m``, and the metrics are reduced over all of them, so **every machine
prints the same final metrics**. The script's ``--machine-run`` mode is that command: it
builds the task from the partition config and passes ``Trainer(ip_config=...,
num_servers=..., machine_rank=...)``.

*What each machine needs*: the repository and its venv; the partition folder (on a
shared filesystem, which keeps the command the same everywhere, or copied: each machine
reads ``cora.json``, ``cora.meta.json`` and its own ``part<m>/``); the same ip_config; and
``--root-dir`` on a filesystem all machines see: checkpoints are written by global rank 0
(on machine 0) and ``test(ckpt_path="best")`` loads them on every rank.

(a) Without ssh or a scheduler: the same command on each machine. Write ``ip_config.txt``,
one line per machine, ``<address> [port]`` (DGL's format; IPv4 addresses, not host
names; the port of the machine's first graph server, 30050 when left out), machine 0
first, and give every machine the same file::

    # ip_config.txt
    10.0.0.11 30050
    10.0.0.12 30050

    # once, anywhere (the folder shared or copied):
    python -m graphtrainer.cli.partition --dataset cora --parts 2 --out /shared/parts/cora-2parts
    # on every machine, in any order:
    python tutorials/11_one_machine_to_many.py --machine-run \\
        --partition /shared/parts/cora-2parts/cora.json --ip-config /shared/ip_config.txt \\
        --root-dir /shared/runs/tutorial11

Each machine finds its own line by its addresses (the line holding one of its interfaces'
addresses). When that is ambiguous (a machine behind NAT, several lines on one host), set
``GRAPHTRAINER_MACHINE_RANK=m`` or pass ``--machine-rank m`` (``Trainer(machine_rank=m)``).
Start the machines within a few minutes of each other: DGL's clients wait for every
server, but a rank that waits longer than the trainer's ``hang_timeout`` (300 s by
default) ends the run.

(b) Slurm: ``sbatch tutorials/11_one_machine_to_many.sbatch`` (2 nodes; ``--nodes=N``
for more; arguments after the file go to the script). It partitions Cora into one part
per node unless ``PART_CONFIG`` exists, writes ip_config from the nodes' own addresses in
node order::

    srun --ntasks-per-node=1 bash -c 'echo "$SLURM_NODEID $(hostname -I | awk "{print \\$1}")"' \\
        | sort -n | awk -v port="$PORT" '{print $2, port}' > "$OUT/ip_config.txt"

(``scontrol show hostnames "$SLURM_JOB_NODELIST"`` with ``getent hosts`` gives the same
when host names resolve to the right network), and runs the script on every node with
``srun --ntasks-per-node=1 ... --machine-run``; each node's machine rank is its
``SLURM_NODEID``, which the trainer reads (with one task per node it acts for the whole
node: it starts the node's servers and ranks; it refuses more tasks than nodes).

*Ports*. Between the machines these must be open (TCP):

- on machine ``m``: its graph servers, the port of its ip_config line ``p_m`` up to
  ``p_m + num_servers - 1``: every rank of every machine connects to every server;
- on machine 0: the ranks' rendezvous (torch.distributed's store, held by rank 0), at
  ``p_0 + num_servers`` (30051 above), or ``$MASTER_PORT`` when set (the same everywhere);
- on every machine, ports the kernel picks (the ephemeral range,
  ``/proc/sys/net/ipv4/ip_local_port_range``): each rank listens for the graph servers'
  connections back to it (DGL's RPC), and gloo connects every pair of ranks. The trainer
  points gloo at the interface that holds the machine's ip_config address.

Nothing else may connect to a graph server's port: DGL counts every connection as a
client, and a stray one (a port scan, a health check) while the ranks connect stalls the
run until the ``hang_timeout``.

*One DistDGL run per machine at a time.* DGL names the node data's shared memory after the
key alone (``/dev/shm/node~_N~feat-kvdata-``): two runs on one machine, even of different
graphs, overwrite each other's features and labels. So the trainer lets one DistDGL run
per machine start its servers at a time (a second one waits, saying so), and the sbatch
file asks for ``--exclusive`` nodes.

(c) Here, simulated machines: ``--simulate N`` (root, Linux). It partitions into N parts,
makes N network namespaces with loopback addresses ``127.100.0.1`` ... (each with its own
``/dev/shm``, as separate machines have: ``graphtrainer.testing.simulated_machines``), writes
their ip_config and starts ``--machine-run`` in each, without a machine rank: each finds
its line by address. Each machine's output lines are prefixed ``[machine m]``; if one
fails, or ``--timeout`` passes, every machine is ended (Ctrl-C first, so that each trainer
stops its graph servers and cleans up after them), and the namespaces go with them.
Without root it prints why it cannot simulate, and exits.

What to look at: step 1's table; step 2's two results lines (best val_acc, test_acc, nodes
scored, ranks, seconds of ``fit`` and ``test``); with ``--simulate 2``, the same results
line printed by both machines (the job's metrics, over its 4 ranks). On several
partitions an epoch is fewer optimizer steps (each machine splits only its own training
nodes), and the graph servers sample remote neighbours with their own generators, so two
simulated runs differ slightly.

Measured output: ``tutorials/results/11_one_machine_to_many.txt`` holds full runs of both
commands above. The smoke tests (``tests/tutorials/test_tutorial_11.py``) run ``--fast`` (2
epochs: step 2's figures checked against ``tutorials/results/11_one_machine_to_many.json``,
and no process or ``/dev/shm`` segment left) and, as root, ``--simulate 2 --fast`` and the
sbatch file under a stand-in ``srun`` that runs each task on a simulated machine.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402
from tutorials.summary import write_summary  # noqa: E402
from tutorials.watch import relay_and_watch  # noqa: E402

SCRIPT = Path(__file__).resolve()
#: Tutorial 1's task settings (01_quickstart_cora.yaml), for every run of this script.
SETTINGS: Dict[str, Any] = dict(fanouts=[10, 10], hidden=128, dropout=0.6, lr=0.005, weight_decay=5e-4,
                                batch_size=32, eval_batch_size=512)
FAST_EPOCHS = 2


def shown(path: "str | os.PathLike[str]") -> str:
    """``path`` relative to the working directory when it lies below it (for printing)."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


# ---------------------------------------------------------------------------------------
# Step 1: partition.
def partition(parts: int, out: Path) -> Path:
    """``python -m graphtrainer.cli.partition --dataset cora --parts K --out DIR``, in this process;
    prints its table and returns the partition config ``DIR/cora.json``."""
    from graphtrainer.cli import partition as gpartition

    argv = ["--dataset", "cora", "--parts", str(parts), "--out", str(out), "--overwrite"]
    print(f"$ python -m graphtrainer.cli.partition {' '.join(argv)}", flush=True)
    summary = gpartition.main(argv)   # the command line's own entry point: table and time line
    return summary.config


# ---------------------------------------------------------------------------------------
# Steps 2 and 3: the training script, the same on one machine and on each of several.
def train(graph: Any, root_dir: Path, epochs: int, num_procs: int, seed: int = 0, **dist: Any) -> Dict[str, Any]:
    """Fit, then test the best checkpoint. ``graph`` is the path of a partition config
    (DistDGL) or a graph (in memory); ``dist`` holds ``ip_config=``, ``num_servers=``,
    ``machine_rank=`` for a run over several machines."""
    started = time.time()
    task = NodeClassification(graph, **SETTINGS)   # a path ending in .json: task.graph is a PartitionedGraph
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    trainer = Trainer(num_procs=num_procs, max_epochs=epochs, seed=seed, default_root_dir=root_dir,
                      progress_bar=False, **dist,
                      callbacks=[ckpt, PrintMetrics(["train_loss", "train_acc", "val_loss", "val_acc"])])
    trainer.fit(task)
    fit_s = time.time() - started
    test = trainer.test(task, ckpt_path="best")
    last = trainer.history[-1]
    return {"epochs": trainer.current_epoch, "world_size": trainer.world_size,
            "final_train_loss": last["train_loss"], "final_val_acc": last["val_acc"],
            "val_nodes": int(last["val_nodes"]), "best_val_acc": ckpt.best_model_score,
            "test_acc": test["test_acc"], "test_loss": test["test_loss"], "test_nodes": int(test["test_nodes"]),
            "checkpoint": ckpt.best_model_path, "log_dir": str(trainer.log_dir),
            "fit_seconds": round(fit_s, 1), "test_seconds": round(time.time() - started - fit_s, 1)}


def results_line(label: str, r: Dict[str, Any]) -> str:
    return (f"{label}: best val_acc {r['best_val_acc']:.4f} over {r['val_nodes']} nodes, test_acc "
            f"{r['test_acc']:.4f} over {r['test_nodes']} nodes, {r['world_size']} ranks; fit {r['fit_seconds']} s, "
            f"test {r['test_seconds']} s")


def one_machine(args: argparse.Namespace) -> Dict[str, Any]:
    """Steps 1 and 2: partition Cora into 1 part, train on it, and train in memory."""
    from graphtrainer import datasets
    from graphtrainer.testing.simulated_machines import can_simulate

    started = time.time()
    root = Path(args.root_dir)
    print("== step 1: partition ==", flush=True)
    config = partition(1, Path(args.parts_dir) / "cora-1part")

    print(f"\n== step 2a: DistDGL on this machine: the task from {shown(config)} alone ==", flush=True)
    dist = train(str(config), root / "distdgl", args.epochs, args.num_procs, args.seed)
    print(results_line("DistDGL, 1 partition", dist), flush=True)

    print("\n== step 2b: the same task in memory: NodeClassification(datasets.load('cora')) ==", flush=True)
    memory = train(datasets.load("cora"), root / "in_memory", args.epochs, args.num_procs, args.seed)
    print(results_line("in memory", memory), flush=True)

    print(f"\ntest_acc: DistDGL {dist['test_acc']:.4f}, in memory {memory['test_acc']:.4f} "
          f"(difference {dist['test_acc'] - memory['test_acc']:+.4f})", flush=True)
    ok, why = can_simulate()
    print("\n== step 3: several machines ==", flush=True)
    print(f"simulate them here: python {shown(SCRIPT)} --simulate 2" if ok else
          f"--simulate is not available here ({why}); see the docstring for real machines", flush=True)
    summary = {"tutorial": "11_one_machine_to_many", "mode": "one_machine", "epochs": args.epochs,
               "num_procs": args.num_procs, "part_config": str(config), "distdgl": dist, "in_memory": memory,
               "seconds": round(time.time() - started, 1)}
    if args.out:
        write_summary(args.out, summary)
    print(f"total {summary['seconds']} s", flush=True)
    return summary


def machine_run(args: argparse.Namespace) -> Dict[str, Any]:
    """What each machine runs (step 3): its graph servers and ranks, for the whole job."""
    from graphtrainer.distdgl.cluster import check_options, resolve_cluster

    options = check_options(args.partition, args.ip_config, args.num_servers, args.machine_rank)
    cluster = resolve_cluster(options, args.num_procs)   # what fit will find: which machine this is
    print(f"machine {cluster.machine_rank} of {cluster.num_machines} ({cluster.address}): "
          f"{args.num_servers} graph server(s) from port {cluster.server_port(0)}, ranks "
          f"{cluster.machine_rank * args.num_procs}-{(cluster.machine_rank + 1) * args.num_procs - 1} of "
          f"{cluster.world_size}; rendezvous {cluster.machines[0][0]}:{cluster.master_port}", flush=True)
    result = train(args.partition, Path(args.root_dir), args.epochs, args.num_procs, args.seed,
                   ip_config=args.ip_config, num_servers=args.num_servers, machine_rank=args.machine_rank)
    result["machine_rank"] = cluster.machine_rank
    # The metrics are reduced over every rank of every machine: each machine prints the same.
    print(results_line(f"machine {cluster.machine_rank}", result), flush=True)
    if args.out:   # OUT/machine<m>/summary.json: OUT may be shared by the machines
        write_summary(Path(args.out) / f"machine{cluster.machine_rank}", result)
    return result


# ---------------------------------------------------------------------------------------
# --simulate N: N "machines" on this box (network namespaces), each running --machine-run.
def simulate(args: argparse.Namespace) -> int:
    from graphtrainer.testing.simulated_machines import SimulatedMachines, can_simulate

    ok, why = can_simulate()
    if not ok:
        print(f"--simulate {args.simulate}: skipped: {why}", flush=True)
        return 0
    started = time.time()
    n = args.simulate
    print(f"== step 1: partition into {n} parts, one per machine ==", flush=True)
    config = partition(n, Path(args.parts_dir) / f"cora-{n}parts")
    root = Path(args.root_dir) / f"simulated-{n}"
    out = Path(args.out) if args.out else None
    codes: List[Optional[int]] = [None] * n
    print(f"\n== step 3: {n} simulated machines ==", flush=True)
    with tempfile.TemporaryDirectory(prefix="tutorial11-") as workdir, SimulatedMachines(n) as machines:
        ip_config = machines.ip_config(os.path.join(workdir, "ip_config.txt"))   # "<address> 30050", a line each
        print(f"[sim] ip_config {ip_config}: " + "; ".join(Path(ip_config).read_text().splitlines()), flush=True)
        procs = []
        for m in range(n):
            argv = [sys.executable, str(SCRIPT), "--machine-run", "--partition", str(config),
                    "--ip-config", ip_config, "--epochs", str(args.epochs), "--num-procs", str(args.num_procs),
                    "--num-servers", str(args.num_servers), "--seed", str(args.seed), "--root-dir", str(root)]
            if out is not None:
                argv += ["--out", str(out)]
            # No --machine-rank: each machine finds its line of ip_config by its own address.
            print(f"[sim] machine {m} ({machines.addresses[m]}): python "
                  f"{' '.join(shown(a) if a.startswith('/') else a for a in argv[1:])}", flush=True)
            procs.append(machines.popen(m, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "DGLBACKEND": "pytorch", "PYTHONUNBUFFERED": "1"}))

        # Ending a machine is Ctrl-C first: its trainer then stops its graph servers and cleans
        # up after them; leaving the block ends whatever is left.
        codes = relay_and_watch(procs, "machine", "sim", args.timeout, stop_signal=signal.SIGINT)
    # Leaving the block ended every process in the namespaces and removed them (and ip_config).
    print("[sim] exit codes: " + ", ".join(f"machine {m} {c}" for m, c in enumerate(codes)), flush=True)
    left = machines.existing()
    summary: Dict[str, Any] = {"tutorial": "11_one_machine_to_many", "mode": "simulate", "machines": n,
                               "epochs": args.epochs, "num_procs": args.num_procs, "part_config": str(config),
                               "exit_codes": codes, "namespaces": machines.names + [machines.switch],
                               "namespaces_left": left, "seconds": round(time.time() - started, 1)}
    if out is not None:
        per_machine = []
        for m in range(n):
            path = out / f"machine{m}" / "summary.json"
            per_machine.append(json.loads(path.read_text()) if path.is_file() else None)
        summary["per_machine"] = per_machine
        write_summary(out, summary)
    print(f"total {summary['seconds']} s", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--fast", action="store_true", help=f"{FAST_EPOCHS} epochs: the smoke test")
    p.add_argument("--num-procs", type=int, default=2, help="trainer ranks per machine")
    p.add_argument("--num-servers", type=int, default=1, help="graph servers per machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--root-dir", default="runs/tutorial11", help="run folders and checkpoints (shared by all machines)")
    p.add_argument("--parts-dir", default=None, help="partition folders (default: ROOT_DIR/parts)")
    p.add_argument("--out", default=None,
                   help="also write the results to OUT/summary.json (--machine-run: OUT/machine<m>/summary.json)")
    p.add_argument("--simulate", type=int, default=0, metavar="N",
                   help="partition into N parts and run on N simulated machines (network namespaces; root)")
    p.add_argument("--timeout", type=float, default=900, help="--simulate: seconds before every machine is ended")
    run = p.add_argument_group("one machine of a multi-machine run (step 3)")
    run.add_argument("--machine-run", action="store_true", help="run this machine's part of the job")
    run.add_argument("--partition", help="the partition config, <name>.json (the same on every machine)")
    run.add_argument("--ip-config", help="'<address> [port]' per machine (the same file on every machine)")
    run.add_argument("--machine-rank", type=int, default=None,
                     help="this machine's line of ip_config (default: $GRAPHTRAINER_MACHINE_RANK, "
                          "$SLURM_NODEID, or the line holding one of this machine's addresses)")
    args = p.parse_args(argv)
    if args.fast:
        args.epochs = FAST_EPOCHS
    if args.parts_dir is None:
        args.parts_dir = str(Path(args.root_dir) / "parts")
    if args.machine_run and not (args.partition and args.ip_config):
        p.error("--machine-run needs --partition and --ip-config")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.machine_run:
        machine_run(args)
        return 0
    if args.simulate:
        return simulate(args)
    one_machine(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
