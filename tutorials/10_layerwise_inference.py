"""Tutorial 10: layer-wise full-graph inference. Sampled and full-neighbourhood test metrics, Cora and Tolokers.

What you will see: GraphSAGE trained with sampled neighbourhoods on 2 ranks, then
evaluated twice at every validation and at test: with the same sampled neighbourhoods
(what a minibatch evaluation loop gives: noisy, and not the number papers report) and
with every neighbour, computed layer by layer by ``graphtrainer.data.inference.layerwise``;
the layer-wise result checked against a one-process full-graph forward of the same
checkpoint; and the seconds it takes.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/10_layerwise_inference.py

What to look at: for each dataset, the test metric with sampled neighbourhoods beside
the full-neighbourhood one from ``layerwise``, the seconds ``layerwise`` took on 2 ranks,
and the largest difference from a one-process full-graph forward (float rounding).
``--fast`` runs 3 epochs per dataset.

Measured output: ``tutorials/results/10_layerwise_inference.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_10.py``) runs ``--fast`` and checks its figures against
``tutorials/results/10_layerwise_inference.json``.

How it works, and the hand-written version it replaces
------------------------------------------------------
DGL's multi-GPU examples end with an ``inference(g, device, batch_size)`` method on the
model: for each layer, loop over all nodes in batches with a full-neighbour sampler of
one layer, compute that layer, and write the rows into an output tensor (each GPU a
share of the nodes, the output in shared or pinned memory); the next layer reads it.
Each node is computed once per layer, instead of once per batch it appears in as a
neighbour, and memory stays at one batch's block plus two layer outputs.

``layerwise(model, graph, features, batch_size=...)`` does this for any model with
per-layer access: a ``layers`` list and an ``inference_layer(i, block, h)`` method that
applies layer ``i`` and what follows it in ``forward`` (``graphtrainer.models.SAGE`` and
``HeteroSAGE`` have both; a model without them gets a ``TypeError`` saying what to add).
Call it on every rank, outside ``training_step``: in ``on_validation_epoch_end``,
``on_test_epoch_end``, ``on_predict_epoch_start``. Rank ``r`` computes the ``r``-th
contiguous range of the nodes (ranges differ by at most one node), in batches, and writes
into an output that every rank maps from one ``/dev/shm`` file, so no rows travel
through collectives and every rank ends with the whole result (one barrier per layer).
It equals a one-process full-graph forward within float rounding (checked below, and
by ``tests/unit/data/test_layerwise.py`` to 1e-5 with uneven ranges on 3 ranks). Peak memory:
``2 × num_nodes × widest layer × 4`` bytes shared by all ranks, plus one batch per rank.
On a heterograph the features and outputs are ``{ntype: tensor}`` (tutorial 9).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import ModelCheckpoint, PrintMetrics, Trainer  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification, standardize_features  # noqa: E402
from graphtrainer.data.inference import layerwise  # noqa: E402
from graphtrainer.evaluation.ranking import accuracy, roc_auc  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402
from tutorials.summary import report  # noqa: E402


class SampledAndFull(NodeClassification):
    """Evaluation batches sample ``fanouts`` neighbours (``{split}_acc`` / ``_auc``); the
    epoch end adds the full-neighbourhood metric from :func:`layerwise` (``{split}_acc_full`` /
    ``_auc_full``) and the seconds it took (``{split}_layerwise_s``)."""

    def _eval_loader(self, split: str) -> Any:
        return self.node_dataloader(self.split_ids[split], self.fanouts, self.eval_batch_size, shuffle=False)

    def _log_full(self, prefix: str) -> None:
        t0 = time.perf_counter()
        logits = layerwise(self.module, self.graph, batch_size=self.eval_batch_size)
        self.log(f"{prefix}_layerwise_s", time.perf_counter() - t0, batch_size=1)
        ids = self.split_ids["val" if prefix == "val" else "test"]
        labels = self.graph.ndata["label"][ids]
        # Every rank holds the whole result and logs the same value.
        self.log(f"{prefix}_acc_full", accuracy(logits[ids], labels), batch_size=1)
        if self.metric == "roc_auc":
            self.log(f"{prefix}_auc_full", roc_auc(torch.softmax(logits[ids], -1)[:, 1], labels), batch_size=1)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_full("val")

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._log_full("test")


SETTINGS = {  # tutorial 1's Cora settings; tutorial 2's Tolokers ones (lr 1e-2)
    "cora": dict(epochs=40, hidden=128, dropout=0.6, lr=5e-3, weight_decay=5e-4, batch_size=32, metric="accuracy"),
    "tolokers": dict(epochs=30, hidden=256, dropout=0.2, lr=1e-2, weight_decay=0.0, batch_size=256, metric="roc_auc"),
}


def run(name: str, args: argparse.Namespace) -> Dict[str, Any]:
    from graphtrainer import datasets

    s = dict(SETTINGS[name])
    epochs = 3 if args.fast else s.pop("epochs")
    s.pop("epochs", None)
    graph = datasets.load(name)
    if name == "tolokers":
        standardize_features(graph)
    key = "auc" if s["metric"] == "roc_auc" else "acc"
    task = SampledAndFull(graph, fanouts=[10, 10], eval_batch_size=1024, **s)
    ckpt = ModelCheckpoint(monitor=f"val_{key}_full", mode="max")
    show = PrintMetrics(["train_loss", f"val_{key}", f"val_{key}_full"])
    trainer = Trainer(num_procs=args.num_procs, max_epochs=epochs, seed=args.seed, progress_bar=False,
                      default_root_dir=args.root_dir, callbacks=[ckpt, show])
    trainer.fit(task)
    test = trainer.test(task, ckpt_path="best")
    # The same checkpoint, one process, the whole graph as every layer's block.
    state = torch.load(ckpt.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    model = SAGE(graph.ndata["feat"].shape[1], task.hidden, task.num_classes, num_layers=2)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        full = model([graph, graph], graph.ndata["feat"])
    diff = float((layerwise(model, graph, batch_size=1024) - full).abs().max())
    print(f"{name}: test_{key} sampled {test[f'test_{key}']:.4f}, full neighbourhoods (layer-wise) "
          f"{test[f'test_{key}_full']:.4f} over {int(test['test_nodes'])} nodes; layer-wise took "
          f"{test['test_layerwise_s']:.2f} s on {args.num_procs} ranks; max |layer-wise - full forward| {diff:.1e}",
          flush=True)
    return {"metric": key, "test_sampled": test[f"test_{key}"], "test_full": test[f"test_{key}_full"],
            "test_nodes": int(test["test_nodes"]), "layerwise_s": test["test_layerwise_s"],
            "max_diff_vs_full_forward": diff, "epochs": trainer.current_epoch}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--datasets", default="cora,tolokers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/tutorial10", help="run folders and checkpoints")
    parser.add_argument("--out", default=None, help="also write the result as JSON to OUT/summary.json")
    parser.add_argument("--fast", action="store_true", help="3 epochs per dataset: the CI smoke test")
    args = parser.parse_args(argv)

    started = time.time()
    result: Dict[str, Any] = {"tutorial": "10_layerwise_inference", "num_procs": args.num_procs}
    for name in args.datasets.split(","):
        result[name] = run(name, args)
    result["seconds"] = round(time.time() - started, 1)
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()
