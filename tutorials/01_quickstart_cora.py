"""Tutorial 1: quick start. GraphSAGE on Cora with 2 processes, best checkpoint, reload, predict.

What you will see: one ``GraphTask`` (model, loaders, steps, optimizer) trained by
``Trainer(num_procs=2)`` on two CPU processes over gloo; validation accuracy every
epoch, reduced exactly over both ranks; the best epoch saved by ``ModelCheckpoint``;
the test accuracy of that checkpoint; and its predictions, obtained twice: with
``trainer.predict(task, ckpt_path="best")`` and by loading the checkpoint's
``state_dict`` into a fresh model in a plain Python process, with no trainer at all.

The trainer and the task come from a config file, ``01_quickstart_cora.yaml`` beside this
script (read by :class:`graphtrainer.cli.GraphTaskCLI`; ``pip install "graphtrainer[cli]"``):
every key can be overridden on the command line (``--trainer.max_epochs 5``,
``--task.init_args.hidden 64``), ``--print_config`` prints the resolved config, and the
run folder keeps it as ``config.yaml``. ``python -m graphtrainer fit --config
tutorials/01_quickstart_cora.yaml`` runs the same fit without the script.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/01_quickstart_cora.py

What to look at: the validation accuracy of each epoch, the epoch ``ModelCheckpoint``
keeps, the test accuracy of that checkpoint, and ``predict()`` and the reloaded model
agreeing with it on every test node. ``--fast`` runs 8 epochs.

Measured output: ``tutorials/results/01_quickstart_cora.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_01.py``) runs ``--fast`` and checks its figures against
``tutorials/results/01_quickstart_cora.json``.

For comparison, ``../shared/datasets/README.md`` lists 81.5 % for GCN on this split
(Kipf & Welling 2017) and ~83.3 % for DGL's full-graph GraphSAGE example; this one
samples 10 neighbours per layer and keeps the epoch with the best validation accuracy.

The classic hand-written workflow, and what replaces each step
---------------------------------------------------------------
A hand-written multi-process DGL script (the shape of DGL's multi-GPU tutorials and of
PyTorch's DDP tutorial) has these steps; the arrow after each says what replaces it.

1. ``g = CoraGraphDataset()[0]``; ``g.create_formats_()`` so forked children share the
   sparse formats copy-on-write.                -> ``graphtrainer.datasets.load("cora")``;
                                                   the trainer calls ``create_formats_()``.
2. ``def run(rank, world_size): dist.init_process_group("gloo",
   init_method="tcp://127.0.0.1:12345", rank=rank, world_size=world_size)``
   (a hard-coded port: two jobs on one machine collide).
                                                -> ``Trainer(num_procs=2)`` picks a free
                                                   port and starts the group in each rank.
3. ``model = DDP(SAGE(...))``, built inside ``run`` so ranks do not share parameters.
                                                -> ``configure_model()``; DDP is applied for you.
4. ``DataLoader(g, train_ids, sampler, use_ddp=True, ...)`` and ``set_epoch(epoch)``.
   (DGL 2.1's loader has no ``set_epoch``, and ``use_ddp`` gives every rank the same
   contiguous slice every epoch.)
                                                -> ``self.node_dataloader(ids, fanouts, bs)``:
                                                   a new global permutation each epoch.
5. The epoch loop: ``zero_grad``, forward, ``loss.backward()``, ``step``; ranks with
   fewer batches hang DDP unless wrapped in ``Join``.
                                                -> ``training_step`` returns the loss.
6. Validation: usually on rank 0 only (the others idle), or each rank evaluates its
   share and ``all_reduce``-s a *mean of per-rank accuracies* (wrong when shares differ).
                                                -> ``validation_step`` + ``self.log``: exact
                                                   mean over every node of every rank
                                                   (``reduce_fx="sum"``: a total, e.g.
                                                   the nodes scored).
7. ``if rank == 0 and acc > best: torch.save(model.module.state_dict(), path)``;
   ``dist.barrier()``.                          -> ``ModelCheckpoint(monitor="val_acc")``:
                                                   rank 0 writes atomically, then a barrier.
8. ``mp.spawn(run, nprocs=2)``, or ``dgl.multiprocessing.Process`` + ``join()``; with the
   latter a rank that crashes leaves its peers blocked in their next collective.
                                                -> ``trainer.fit(task)``; a failing rank
                                                   ends the rest and raises here.
9. Reload the best weights, test, predict: another script, or more code in ``run``.
                                                -> ``trainer.test(task, ckpt_path="best")``,
                                                   ``trainer.predict(task, ckpt_path="best")``.

The task
--------
The ``GraphTask`` is :class:`graphtrainer.examples.node_classification.NodeClassification`
(``graphtrainer/examples/node_classification.py``, about 120 lines): read it next to this
script, each method is one of the steps above. ``__init__`` keeps the graph and the
split ids; ``configure_model`` builds the SAGE network (step 3); ``train_dataloader``
returns ``self.node_dataloader(ids, fanouts, batch_size)`` (step 4); ``training_step``
returns the loss and ``self.log``-s it (step 5); ``validation_step`` logs ``val_loss``,
``val_acc`` and ``val_nodes`` (step 6; evaluation takes every neighbour, so it is exact);
``predict_step`` returns class probabilities, one row per seed. This script only picks
Cora's settings.

The checkpoint is a plain ``torch.save`` dict: ``ckpt["state_dict"]`` (no ``module.``
prefix) loads into the bare model, as the end of :func:`main` shows.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402
from tutorials.config_cli import TutorialCLI  # noqa: E402
from tutorials.summary import report  # noqa: E402


def full_graph_inference(model: torch.nn.Module, graph: Any) -> torch.Tensor:
    """Logits for every node, the whole graph as each layer's "block" (no sampling, no trainer)."""
    model.eval()
    with torch.no_grad():
        return model([graph] * len(model.layers), graph.ndata["feat"])


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    # Trainer and task from 01_quickstart_cora.yaml (beside this file), with any key
    # overridden on the command line (--trainer.max_epochs 5, --task.init_args.hidden 64).
    started = time.time()
    cli = TutorialCLI(__file__, fast_epochs=8, argv=argv, description=__doc__.split("\n")[0])
    trainer, task = cli.trainer, cli.task
    graph = task.graph
    print(f"cora: {graph.num_nodes()} nodes, {graph.num_edges()} edges, {graph.ndata['feat'].shape[1]} "
          f"features, {task.num_classes} classes; train/val/test "
          f"{len(task.split_ids['train'])}/{len(task.split_ids['val'])}/{len(task.split_ids['test'])}", flush=True)

    ckpt = next(cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint))
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best checkpoint {ckpt.best_model_path} "
          f"(val_acc {ckpt.best_model_score:.4f})", flush=True)

    # Test the best checkpoint: the ranks load it, score their shares, reduce exactly.
    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {trainer.num_procs} ranks, exact): test_acc {test['test_acc']:.4f} "
          f"over {int(test['test_nodes'])} nodes", flush=True)

    # Predict with the best checkpoint: rows come back in the order of the ids given.
    probs = trainer.predict(task, ckpt_path="best")
    labels = graph.ndata["label"][task.split_ids["test"]]
    pred_acc = float((probs.argmax(-1) == labels).float().mean())
    print(f"predict (best checkpoint, {trainer.num_procs} ranks): {probs.shape[0]} rows; accuracy {pred_acc:.4f}",
          flush=True)

    # Reload by hand: the checkpoint is a torch.save dict; its state_dict fits the bare model.
    state = torch.load(ckpt.best_model_path, map_location="cpu", weights_only=True)
    fresh = SAGE(graph.ndata["feat"].shape[1], task.hidden, task.num_classes, num_layers=len(task.fanouts))
    fresh.load_state_dict(state["state_dict"])
    logits = full_graph_inference(fresh, graph)[task.split_ids["test"]]
    fresh_acc = float((logits.argmax(-1) == labels).float().mean())
    agree = int((logits.argmax(-1) == probs.argmax(-1)).sum())
    print(f"fresh model + checkpoint state_dict, full-graph inference in this process: test accuracy "
          f"{fresh_acc:.4f}; same arg-max as predict() for {agree}/{len(labels)} nodes", flush=True)

    last = trainer.history[-1]
    result = {
        "tutorial": "01_quickstart_cora", "num_procs": trainer.num_procs, "epochs": trainer.current_epoch,
        "final_train_loss": last["train_loss"], "final_val_acc": last["val_acc"],
        "val_nodes": int(last["val_nodes"]), "best_val_acc": ckpt.best_model_score,
        "test_acc": test["test_acc"], "test_nodes": int(test["test_nodes"]),
        "predict_rows": int(probs.shape[0]), "predict_acc": pred_acc,
        "fresh_model_acc": fresh_acc, "fresh_model_agree": agree,
        "checkpoint": ckpt.best_model_path, "checkpoint_epoch": int(state["epoch"]),
        "log_dir": str(trainer.log_dir), "fit_seconds": round(fit_s, 1),
        "seconds": round(time.time() - started, 1),
    }
    report(result, cli.config.out)
    return result


if __name__ == "__main__":
    main()
