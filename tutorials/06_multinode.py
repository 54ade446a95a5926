"""Tutorial 6: multi-node training, under torchrun across nodes and under Slurm.

PyTorch's multi-node DDP tutorial (``ddp_series_multinode``) and PyG's multi-node
examples (``multinode_multigpu_papers100m_gcn.py``, ``distributed_sampling_multinode.py``)
run one process per GPU on every node. The processes are started by a launcher on each
node, ``torchrun`` or Slurm's ``srun``, and find each other through a rendezvous host
and port (``MASTER_ADDR``/``MASTER_PORT``). With graphtrainer the training script is the
single-machine script, unchanged: when ``RANK``/``WORLD_SIZE`` (torchrun) or
``SLURM_PROCID``/``SLURM_NTASKS`` (srun, more than one task) are set, ``Trainer``
launches nothing and each process runs its own rank of the job.

This script trains GraphSAGE on Cora (the shipped files). Three ways to run it:

* On one machine, the trainer starts the ranks itself (fork)::

      bash scripts/env.sh python tutorials/06_multinode.py --num-procs 2

  (With ``--gpus N`` it forks one rank per GPU; a parent that has already used CUDA,
  ``torch.cuda.is_available()`` included, makes it spawn them instead, with a warning.)

* Across nodes with torchrun: run this on every node, with ``--node-rank`` 0 on the node
  whose address is ``--master-addr`` and 1, 2, ... on the others (``--nproc-per-node``
  is the GPUs per node; add ``--gpus N`` for GPUs; each node needs the repository, the
  venv, the data, and ``--out`` on a filesystem all nodes see, see "Files" below)::

      python -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
          --master-addr node01 --master-port 29500 tutorials/06_multinode.py --gpus 4

  torchrun's elastic rendezvous (PyTorch's tutorial's form) needs no node ranks; the
  rendezvous then decides which node holds global rank 0::

      python -m torch.distributed.run --nnodes 2 --nproc-per-node 4 --rdzv-id job1 \\
          --rdzv-backend c10d --rdzv-endpoint node01:29500 tutorials/06_multinode.py --gpus 4

  Threads: with several processes per node torchrun sets ``OMP_NUM_THREADS=1``, and
  that stays unless the script asks for more: ``--threads-per-proc N`` here, i.e.
  ``Trainer(threads_per_proc=N)``, which each rank applies to torch and DGL (e.g. the
  node's cores divided by its ranks; neighbour sampling runs on these threads).

* Under Slurm: ``sbatch tutorials/06_multinode.sbatch`` (2 nodes x 4 GPUs, one task per
  GPU started by ``srun``; the file explains every line).

Here, on one 2-core machine, two torchrun "nodes" on 127.0.0.1, one process each::

    # terminal 1                                      # terminal 2
    bash scripts/env.sh python -m torch.distributed.run --nnodes 2 --node-rank 0 \\
        --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29533 \\
        tutorials/06_multinode.py --threads-per-proc 1 --out runs/tutorial06
                                                      # the same with --node-rank 1

(``--threads-per-proc 1``: the two "nodes" share 2 cores, and torchrun leaves the
thread count alone when it starts one process per node.) Or both at once, started and
watched by this script (``--local-demo``; it picks a free port, passes
``--threads-per-proc`` = cores // 2 unless given, prefixes each node's output with
``[node i]`` and ends both if one fails or ``--timeout`` passes)::

    bash scripts/env.sh python tutorials/06_multinode.py --local-demo

The numbers are the same as those of ``--num-procs 2`` on one machine: the trainer seeds
and splits by global rank, whoever started the ranks.

What to look at: only ``[node 0]`` (global rank 0) prints the epochs and results; the
``rank N:`` lines give each rank's node, local rank and thread count; then the test
accuracy of the best checkpoint and both nodes' exit codes.

Measured output: ``tutorials/results/06_multinode.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_06.py``) runs ``--fast`` and checks its figures against
``tutorials/results/06_multinode.json``.

Smoke test (3 epochs; ``tests/tutorials/test_tutorial_06.py`` starts the two torchrun nodes itself
with timeouts, and also runs the sbatch file under a stand-in ``srun``)::

    bash scripts/env.sh python tutorials/06_multinode.py --local-demo --fast --out /tmp/t06

The hand-written multi-node script, step by step, and what replaces it
----------------------------------------------------------------------
PyG's ``distributed_sampling_multinode.py`` and PyTorch's ``multinode.py``
(``ddp-tutorial-series``) do, in every process:

1. Read ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` from the environment (PyG's falls
   back to ``SLURM_NTASKS``, ``SLURM_PROCID`` and ``SLURM_LOCALID``).
2. ``dist.init_process_group("nccl")``, which reads ``MASTER_ADDR``/``MASTER_PORT``
   from the environment (PyG: "make sure those are set!").
3. PyG: read the dataset on rank 0, ``dist.barrier()``, then on the others.
4. ``torch.cuda.set_device(local_rank)``; ``DDP(model.to(local_rank), device_ids=[local_rank])``:
   the *local* rank picks the GPU, the *global* rank picks the data shard.
5. A shard of the training ids per global rank: PyG's
   ``train_idx.split(train_idx.size(0) // world_size)[rank]``, the same every epoch;
   PyTorch's ``DistributedSampler`` with ``set_epoch``.
6. The training loop; ``dist.barrier()``; print on rank 0 only.
7. PyG: evaluate on rank 0 alone ("We evaluate on a single GPU for now").
8. PyTorch: save a snapshot on global rank 0; every rank loads it when resuming.
9. ``dist.destroy_process_group()``.

graphtrainer does 1 and 2 (``graphtrainer.launch.environment.detect_external_launch``: torchrun's
variables first, then Slurm's; with Slurm and no ``MASTER_ADDR`` it takes the first host
of ``SLURM_STEP_NODELIST``/``SLURM_NODELIST``, and without ``MASTER_PORT`` it uses
``15000 + SLURM_JOB_ID % 17000``, the same on every task of a job), 4 (the GPU of the
local rank, or ``gpus=[...]`` indexed by local rank; ``cuda:0`` when the rank sees
exactly one GPU, as under Slurm's ``--gpus-per-task=1`` or a per-rank
``CUDA_VISIBLE_DEVICES``; a clear error naming the rank when its GPU does not exist;
nccl on GPUs, gloo on CPUs), 5 (a new global permutation each epoch, split
evenly by global rank), 6 (``Join`` for uneven inputs, exact metric reduction, output
on rank 0), 7 (validation and test on *all* ranks, each node scored once, reduced
exactly) and 8 (``ModelCheckpoint``: global rank 0 writes atomically, every rank
resumes with ``fit(task, ckpt_path=...)``), plus the run directory chosen by rank 0 and
broadcast, and errors naming the rank. 9 is not needed: the group stays up for the
process's next ``fit``/``test`` call and goes with the process. 3 is not needed for
the shipped datasets: ``graphtrainer.datasets.load`` holds a file lock while it builds
DGL's processed cache of Cora/CiteSeer, so ranks that load at the same moment are safe
(one builds it, the others wait, then read it). For your own data it stays yours: see
"Files".

Files
-----
* **Data**: every process loads the dataset itself. Put the data where every node reads
  it (``GRAPHTRAINER_DATA``). ``datasets.load`` locks its cache build (``flock`` on a
  file beside the cache, under ``~/.cache/graphtrainer`` or ``GRAPHTRAINER_CACHE``), so
  concurrent ranks are safe without a warm-up; the sbatch file and ``--local-demo``
  still load the data once before the ranks start, which only spares the ranks waiting
  on each other. Across nodes the lock needs a cache filesystem that supports ``flock``
  (NFS does; Lustre only when mounted with ``flock``); a node-local
  ``GRAPHTRAINER_CACHE`` avoids the question. A loader of your own that writes a cache
  needs the same care (a lock, or rank 0 first, then ``dist.barrier()``).
* **Checkpoints and runs** are written by global rank 0 only. ``trainer.test(task,
  ckpt_path="best")`` then loads that file on every rank, so ``--out`` must be on a
  filesystem all nodes see (on Slurm clusters, the home or scratch filesystem). Only
  rank 0 writes ``summary.json``.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer import comm as gdist  # noqa: E402
from graphtrainer.launch.environment import detect_external_launch, free_port  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402
from tutorials.summary import write_summary  # noqa: E402
from tutorials.watch import relay_and_watch  # noqa: E402


class RecordRanks(Callback):
    """Collect, on rank 0, where every rank of the job runs (host, node, local rank, pid)."""

    def __init__(self) -> None:
        self.ranks: List[Dict[str, Any]] = []

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        local = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID"))
        me = {"rank": trainer.rank, "world_size": trainer.world_size,
              # Ranks the trainer started itself all run on this machine: local = global.
              "local_rank": int(local) if local is not None else trainer.rank,
              # torchrun calls the node's index GROUP_RANK; srun calls it SLURM_NODEID.
              "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", 0))),
              "host": socket.gethostname(), "pid": os.getpid(), "device": str(trainer.device),
              "threads": torch.get_num_threads()}   # threads_per_proc, or the launcher's setting
        self.ranks = gdist.all_gather_object(me)  # collective: every rank calls it, here outside Join

    # Callback state travels back from launched ranks to the caller (and into checkpoints).
    def state_dict(self) -> Dict[str, Any]:
        return {"ranks": list(self.ranks)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.ranks = list(state.get("ranks", []))


def train(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The training script: the same code on one machine, under torchrun, under srun."""
    from graphtrainer import datasets

    external = detect_external_launch()   # None when this process must launch the ranks
    started = time.time()
    graph = datasets.load("cora")                # every process loads it: see "Files"
    task = NodeClassification(graph, fanouts=[10, 10], hidden=args.hidden, dropout=0.5, lr=1e-2,
                              weight_decay=5e-4, batch_size=32, eval_batch_size=512)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", filename="{epoch}-{val_acc:.4f}")
    ranks = RecordRanks()
    # num_procs (and the count in gpus) only matter when nothing launched us; under torchrun
    # or srun the job's layout comes from the environment.
    trainer = Trainer(gpus=args.gpus or None, num_procs=None if args.gpus else args.num_procs,
                      max_epochs=args.epochs, seed=args.seed, threads_per_proc=args.threads_per_proc,
                      default_root_dir=Path(args.root_dir or Path(args.out) / "runs"),
                      callbacks=[ckpt, ranks, PrintMetrics(["train_loss", "val_loss", "val_acc"])],
                      progress_bar=False)
    if external is None or external.rank == 0:
        how = (f"launched by {external.source}: {external.world_size} processes, rendezvous at "
               f"{external.master_addr}:{external.master_port}" if external else
               f"no launcher: the trainer starts {trainer.num_procs} ranks itself")
        print(f"cora: {graph.num_nodes()} nodes, {graph.num_edges()} edges; {how}", flush=True)
    trainer.fit(task)
    test = trainer.test(task, ckpt_path="best")
    if trainer.rank != 0:                         # rank 0 reports; the other ranks are done
        return None
    last = trainer.history[-1]
    summary = {
        "tutorial": "06_multinode", "launched_by": external.source if external else "graphtrainer",
        "world_size": len(ranks.ranks) or trainer.num_procs, "ranks": ranks.ranks,
        "epochs": trainer.current_epoch, "num_classes": task.num_classes,
        "train_loss_first": trainer.history[0]["train_loss"], "train_loss_last": last["train_loss"],
        "val_acc_last": last["val_acc"], "best_val_acc": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_loss": test["test_loss"],
        "checkpoint": ckpt.best_model_path, "log_dir": str(trainer.log_dir),
        "seconds": round(time.time() - started, 1),
    }
    for r in ranks.ranks:
        print(f"rank {r['rank']}: node {r['node_rank']}, local rank {r['local_rank']}, "
              f"host {r['host']}, pid {r['pid']}, {r['device']}, {r['threads']} thread(s)")
    print(f"best checkpoint {ckpt.best_model_path} (val_acc {ckpt.best_model_score:.4f})")
    print(f"test_acc {test['test_acc']:.4f}  (written by rank 0 of {summary['world_size']})", flush=True)
    path = write_summary(args.out, summary)
    print(f"summary written to {path} ({summary['seconds']} s)", flush=True)
    return summary


# ---------------------------------------------------------------------------------------
# --local-demo: two torchrun "nodes" on 127.0.0.1, started and watched by this process.
# ---------------------------------------------------------------------------------------
def torchrun_node_command(node_rank: int, nnodes: int, port: int, script_args: Sequence[str]) -> List[str]:
    """The command one node runs: ``python -m torch.distributed.run`` (= ``torchrun``)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(Path(__file__).resolve()), *script_args]


def local_demo(args: argparse.Namespace, script_args: List[str]) -> int:
    from graphtrainer import datasets

    # Optional: datasets.load locks DGL's cache build, so ranks loading Cora at once are
    # safe; building the cache here just spares them waiting for each other.
    datasets.load("cora")
    port = free_port()
    if args.threads_per_proc is None:      # the 2 "nodes" share this machine's cores
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
        script_args = [*script_args, "--threads-per-proc", str(max(1, cores // 2))]
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    procs = []
    for node in range(2):
        cmd = torchrun_node_command(node, 2, port, script_args)
        print(f"[demo] node {node}: {' '.join(cmd[1:])}", flush=True)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))

    # "Ending" is SIGTERM to the node's process group: torchrun passes it on to its ranks.
    relay_and_watch(procs, "node", "demo", args.timeout)
    codes = [p.returncode for p in procs]
    print(f"[demo] exit codes: node 0 {codes[0]}, node 1 {codes[1]}", flush=True)
    return 0 if codes == [0, 0] else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2, help="ranks to start when nothing launched us")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: CPU ranks over gloo)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads-per-proc", type=int, default=None,
                        help="intra-op threads per rank (default: cores // ranks when the trainer starts "
                             "the ranks; the launcher's setting under torchrun/srun)")
    parser.add_argument("--out", default="runs/tutorial06", help="runs, checkpoints and summary.json")
    parser.add_argument("--root-dir", default=None, help="run folders and checkpoints (default: OUT/runs)")
    parser.add_argument("--fast", action="store_true", help="3 epochs: a smoke test")
    parser.add_argument("--local-demo", action="store_true",
                        help="start two torchrun nodes on 127.0.0.1 (one process each) and relay their output")
    parser.add_argument("--timeout", type=float, default=600, help="--local-demo: seconds before both nodes are ended")
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs = 3
    argv = list(sys.argv[1:] if argv is None else argv)
    # What each node runs: the same arguments, minus the demo's own.
    script_args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--local-demo":
            continue
        elif a == "--timeout":
            skip = True
        elif not a.startswith("--timeout="):
            script_args.append(a)
    return args, script_args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, script_args = parse_args(argv)
    if args.local_demo:
        if detect_external_launch() is not None:
            raise SystemExit("--local-demo starts its own torchrun nodes: run it without torchrun/srun")
        return local_demo(args, script_args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
