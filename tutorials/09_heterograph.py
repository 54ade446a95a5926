"""Tutorial 9: a heterograph. Cora as papers and words, an R-GCN-style HeteroSAGE, 2 processes.

What you will see: Cora turned into a heterograph of 2,708 papers and 1,433 words
(``graphtrainer.datasets.cora_hetero()``: ``paper-cites-paper``, and ``paper-has-word`` /
``word-in-paper`` from the bag-of-words features); ``node_dataloader({"paper": ids}, ...)``
splitting the paper seeds between 2 ranks; a ``HeteroGraphConv`` of ``SAGEConv``\\ s per
relation, with learned word embeddings; what DDP says when some parameters get no
gradient, and ``Trainer(find_unused_parameters=True)``, with its cost measured; the test
accuracy with sampled neighbourhoods beside the one with full neighbourhoods, computed
layer by layer by ``graphtrainer.data.inference.layerwise`` (each rank a share of the nodes,
one shared output) and used by ``predict``.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/09_heterograph.py

What to look at: HeteroSAGE failing under DDP without ``find_unused_parameters`` (the
error names the option), the per-step cost of the option, and the test accuracy with
sampled and with full neighbourhoods. ``--fast`` runs 8 epochs, 2 timing epochs per
setting and 20 walk steps.

Measured output: ``tutorials/results/09_heterograph.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_09.py``) runs ``--fast`` and checks its figures against
``tutorials/results/09_heterograph.json``.

Full neighbourhoods score the test papers better than 10 sampled neighbours per
relation, and both stay below the homogeneous GraphSAGE of tutorial 1 on the same split.
The words carry the information of the paper features again, but as 1,433 learned
embeddings trained from 140 labelled papers, which the model overfits. Sampling hurts
more than on the homogeneous graph: a paper has 18 words on average and keeps 10 of
them, and each word 10 of its papers.

The cost of find_unused_parameters
----------------------------------
The first lines of the output time whole training steps on 2 ranks (epochs 2-5 of a run
on every non-test paper). HeteroSAGE fails without the option, and with
``static_graph=True`` too: which parameters go unused changes from step to step (a batch
without some relation leaves its weights out), and static_graph only handles a fixed set.
On SAGE, which uses every parameter, whole-step timings on a shared machine vary more
than the option costs.

The two lines after them isolate the option: the same fixed batch, forward and backward under
DDP with and without it, steps interleaved one by one so that load on the machine hits
both alike (the heterograph batch has paper and word seeds, so every parameter is used
and both settings run). What differs is DDP's walk of the autograd graph, which visits
every autograd node once; a heterograph model has one set per relation and layer. That
is the price of the option on a model that needs it; leave it off when every parameter
is always used, as DDP's own warning (printed once per rank) suggests.

"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint, PrintMetrics, RankFailedError, Trainer  # noqa: E402
from graphtrainer.examples.hetero_classification import HeteroClassification  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402
from tutorials.summary import report  # noqa: E402


class EpochTimer:
    """Logs the seconds of each training epoch (rank mean) and trains on every non-test node:
    more steps per epoch for the DDP timing runs."""

    def train_dataloader(self) -> Any:
        g = self.graph
        if len(g.ntypes) > 1:
            ids = {"paper": (~g.nodes["paper"].data["test_mask"]).nonzero(as_tuple=True)[0]}
        else:
            ids = (~g.ndata["test_mask"]).nonzero(as_tuple=True)[0]
        return self.node_dataloader(ids, self.fanouts, self.batch_size)

    def on_train_epoch_start(self) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        self.log("epoch_s", time.perf_counter() - self._t0, batch_size=1)


class TimedHetero(EpochTimer, HeteroClassification):
    pass


class TimedSage(EpochTimer, NodeClassification):
    pass


def ddp_cost(graph: Any, args: argparse.Namespace, epochs: int) -> Dict[str, Any]:
    """Milliseconds per training step (first epoch, DDP's warm-up, left out) of HeteroSAGE
    without the option (fails), with find_unused_parameters, with static_graph (fails: the
    unused set changes between steps); and of the homogeneous SAGE, which uses every
    parameter, with and without find_unused_parameters (the price of the graph walk)."""
    from graphtrainer import datasets

    homo = datasets.load("cora")
    out: Dict[str, Any] = {}
    hetero_task = lambda: TimedHetero(graph, fanouts=args.fanouts, hidden=args.hidden,  # noqa: E731
                                      embed_dim=args.embed_dim, dropout=args.dropout, lr=args.lr,
                                      batch_size=args.batch_size, layerwise_eval=False)
    sage_task = lambda: TimedSage(homo, fanouts=args.fanouts, hidden=args.hidden, dropout=args.dropout,  # noqa: E731
                                  lr=args.lr, batch_size=args.batch_size)
    runs = [("hetero, no option", hetero_task, {}),
            ("hetero, find_unused_parameters", hetero_task, {"find_unused_parameters": True}),
            ("hetero, static_graph", hetero_task, {"ddp_kwargs": {"static_graph": True}}),
            ("sage, no option", sage_task, {}),
            ("sage, find_unused_parameters", sage_task, {"find_unused_parameters": True})]
    for name, make, option in runs:
        trainer = Trainer(num_procs=args.num_procs, max_epochs=epochs + 1, seed=args.seed, progress_bar=False,
                          logger=False, default_root_dir=args.root_dir, **option)
        try:
            trainer.fit(make())
        except RankFailedError as err:
            message = str(err).splitlines()[0]
            print(f"{name}: fails: {message[:150]}...", flush=True)
            out[name] = "fails" + (", naming the option" if "find_unused_parameters=True" in str(err) else "")
            continue
        steps = trainer.global_step * epochs // (epochs + 1)
        ms = 1000 * sum(row["epoch_s"] for row in trainer.history[1:]) / steps
        out[name] = round(ms, 2)
        print(f"{name}: {ms:.2f} ms per step over {steps} steps", flush=True)
    return out


def walk_cost(graph: Any, steps: int) -> Dict[str, float]:
    """Milliseconds per forward + backward of one fixed batch under DDP with and without
    find_unused_parameters, interleaved step by step (so machine load hits both alike), in
    this process (a 1-rank gloo group: the walk is local, whatever the world size). The
    heterograph batch has paper and word seeds, so every parameter is used and both
    settings run; SAGE runs on Cora's homogeneous graph."""
    import copy
    import os

    import dgl
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from graphtrainer import datasets
    from graphtrainer.launch.environment import free_port
    from graphtrainer.models import SAGE, HeteroSAGE

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as each of the 2 ranks has: steadier on a shared machine
    try:
        torch.manual_seed(0)
        sampler = dgl.dataloading.NeighborSampler([10, 10])
        _, _, blocks = sampler.sample(graph, {"paper": torch.arange(256), "word": torch.arange(64)})
        ids = blocks[0].srcdata[dgl.NID]
        x = {"paper": graph.nodes["paper"].data["feat"][ids["paper"]]}
        labels = graph.nodes["paper"].data["label"][blocks[-1].dstdata[dgl.NID]["paper"]]
        hetero = HeteroSAGE(graph.canonical_etypes, {nt: graph.num_nodes(nt) for nt in graph.ntypes},
                            {"paper": x["paper"].shape[1]}, 64, 7, embed_dim=16)
        homo_g = datasets.load("cora")
        _, _, hblocks = sampler.sample(homo_g, torch.arange(256))
        hx = homo_g.ndata["feat"][hblocks[0].srcdata[dgl.NID]]
        hlabels = homo_g.ndata["label"][hblocks[-1].dstdata[dgl.NID]]
        sage = SAGE(hx.shape[1], 64, 7)

        def hetero_loss(model: Any) -> torch.Tensor:
            out = model(blocks, x)
            return F.cross_entropy(out["paper"], labels) + out["word"].pow(2).mean()

        def sage_loss(model: Any) -> torch.Tensor:
            return F.cross_entropy(model(hblocks, hx), hlabels)

        out: Dict[str, float] = {}
        for name, model, loss_fn in (("hetero", hetero, hetero_loss), ("sage", sage, sage_loss)):
            wrapped = {flag: DDP(copy.deepcopy(model), find_unused_parameters=flag) for flag in (False, True)}
            spent = {False: 0.0, True: 0.0}
            for step in range(steps + 5):
                for flag in (False, True):
                    t0 = time.perf_counter()
                    loss_fn(wrapped[flag]).backward()
                    if step >= 5:  # the first steps build DDP's buckets
                        spent[flag] += time.perf_counter() - t0
            for flag in (False, True):
                out[f"{name}, find_unused_parameters={flag}"] = round(1000 * spent[flag] / steps, 2)
            print(f"{name} forward + backward, one fixed batch, {steps} interleaved steps: "
                  f"{1000 * spent[False] / steps:.2f} ms without find_unused_parameters, "
                  f"{1000 * spent[True] / steps:.2f} ms with it", flush=True)
        return out
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--embed-dim", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--dropout", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--timing-epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial09", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="8 epochs: the CI smoke test")
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs, args.timing_epochs = 8, 2
    args.fanouts = [int(f) for f in args.fanouts.split(",")]

    from graphtrainer import datasets

    started = time.time()
    graph = datasets.cora_hetero()      # offline: ../shared/datasets (or $GRAPHTRAINER_DATA)
    print(f"cora_hetero: {dict((nt, graph.num_nodes(nt)) for nt in graph.ntypes)} nodes; "
          f"{dict((et[1], graph.num_edges(et)) for et in graph.canonical_etypes)} edges", flush=True)

    cost = ddp_cost(graph, args, args.timing_epochs)
    walk = walk_cost(graph, 20 if args.fast else 200)

    task = HeteroClassification(graph, fanouts=args.fanouts, hidden=args.hidden, embed_dim=args.embed_dim,
                                dropout=args.dropout, lr=args.lr, batch_size=args.batch_size)
    # Keep the epoch whose full-neighbourhood validation accuracy is best.
    ckpt = ModelCheckpoint(monitor="val_acc_full", mode="max", filename="{epoch}-{val_acc_full:.4f}")
    show = PrintMetrics(["train_loss", "val_acc", "val_acc_full"])
    trainer = Trainer(num_procs=args.num_procs, max_epochs=args.epochs, seed=args.seed, progress_bar=False,
                      default_root_dir=args.root_dir, callbacks=[ckpt, show], find_unused_parameters=True)
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best val_acc_full "
          f"{ckpt.best_model_score:.4f}", flush=True)

    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {args.num_procs} ranks): sampled neighbourhoods test_acc {test['test_acc']:.4f}; "
          f"full neighbourhoods (layer-wise) test_acc_full {test['test_acc_full']:.4f}; "
          f"{int(test['test_nodes'])} nodes", flush=True)
    probs = trainer.predict(task, ckpt_path="best")
    labels = graph.nodes["paper"].data["label"][task.split_ids["test"]]
    pred_acc = float((probs.argmax(-1) == labels).float().mean())
    print(f"predict (layer-wise, best checkpoint): {probs.shape[0]} rows; accuracy {pred_acc:.4f}", flush=True)

    result = {
        "tutorial": "09_heterograph", "num_procs": args.num_procs, "epochs": trainer.current_epoch,
        "num_nodes": {nt: graph.num_nodes(nt) for nt in graph.ntypes},
        "num_edges": {et[1]: graph.num_edges(et) for et in graph.canonical_etypes},
        "best_val_acc_full": ckpt.best_model_score, "test_acc": test["test_acc"],
        "test_acc_full": test["test_acc_full"], "test_nodes": int(test["test_nodes"]),
        "predict_rows": int(probs.shape[0]), "predict_acc": pred_acc,
        "ddp_ms_per_step": cost, "walk_ms_per_step": walk, "final_train_loss": trainer.history[-1]["train_loss"],
        "fit_seconds": round(fit_s, 1), "seconds": round(time.time() - started, 1),
    }
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()
