"""Tutorial 7: link prediction on Cora (or CiteSeer) with 2 processes: edge batches, negatives, exact ranking metrics.

What you will see: the classic link-prediction split (85 % train / 5 % val / 10 % test
of the undirected edges), a GraphSAGE encoder with a dot-product scorer trained on edge
minibatches from ``self.edge_dataloader`` (DGL's ``as_edge_prediction_sampler`` inside,
reverse edges excluded from sampling, uniform negatives), ROC-AUC, AP, MRR and Hits@20
computed exactly over both ranks, the best checkpoint tested, and ``predict`` returning
one score per test pair in the order the pairs were given.

The trainer's options and the task's arguments come from ``07_link_prediction.yaml``
beside this script, read by :class:`graphtrainer.cli.GraphTaskCLI` for the script's own
task class (``pip install "graphtrainer[cli]"``): override any key on the command line
(``--task.dataset citeseer``, ``--trainer.max_epochs 5``), print the resolved config with
``--print_config``; the run folder keeps it as ``config.yaml``.

Run it (from the repository root; ``scripts/env.sh`` makes the venv the first time):

    bash scripts/env.sh python tutorials/07_link_prediction.py

What to look at: ``val_auc`` and ``val_mrr`` rising per epoch; the test ROC-AUC, AP, MRR
and Hits@20 of the best checkpoint, exact over both ranks; and ``predict``'s rows giving
the same ROC-AUC and MRR when recomputed. ``--fast`` runs 4 epochs; ``--task.dataset
citeseer`` runs CiteSeer.

Measured output: ``tutorials/results/07_link_prediction.txt`` holds a full run of the command
above (the machine it ran on and its wall time); the smoke test
(``tests/tutorials/test_tutorial_07.py``) runs ``--fast`` and checks its figures against
``tutorials/results/07_link_prediction.json``.

For comparison: GAE reaches a test ROC-AUC of 91.0 on Cora and 89.5 on CiteSeer (Kipf &
Welling 2016, "Variational Graph Auto-Encoders", full-graph, one negative per positive).
Here every test edge has 20 uniform negatives of its own: ROC-AUC does not depend on
that ratio, AP does (it is lower with more negatives), MRR ranks each edge among its 20
negatives, and Hits@20 (OGB's definition) counts the test edges scored above the 20th best
negative of all 10,540.

The classic hand-written workflow, and what replaces each step
---------------------------------------------------------------
1. Split the edges: drop self-loops and one direction of each undirected edge, permute,
   cut 85/5/10; build the training graph from the training edges in both directions and
   remember which edge is whose reverse.
                                                -> ``datasets.link_split(graph, seed=0)``
                                                   (``LinkPrediction.__init__``):
                                                   ``.graph``, ``.train_eids``,
                                                   ``.reverse_eids``, ``.val``, ``.test``.
2. ``DataLoader(g, train_eids, as_edge_prediction_sampler(sampler, exclude="reverse_id",
   reverse_eids=..., negative_sampler=Uniform(1)), use_ddp=True)``. DGL 2.1's ``use_ddp``
   gives each rank the same slice every epoch, and a wrong ``reverse_eids`` is not
   noticed: DGL excludes whichever edges it names, and the true reverses stay in the blocks.
                                                -> ``self.edge_dataloader(eids, fanouts, bs,
                                                   negatives=1, exclude="reverse_id",
                                                   reverse_eids=...)``: a new global
                                                   permutation each epoch; ids and reverse
                                                   ids checked before any sampling.
3. Validation/test edges are not in the training graph, so DGL's edge loader cannot
   serve them; hand-written code computes every node's embedding on one rank and scores
   pairs there.                                 -> ``self.edge_dataloader((src, dst), ...)``:
                                                   pairs are split between ranks like ids,
                                                   each scored exactly once.
4. Negatives for evaluation: drawn anew on each rank each time, so the metric moves from
   run to run and differs with the number of ranks.
                                                -> the j-th negative of an edge is a hash
                                                   of (seed, epoch, edge, j): the same
                                                   for any number of ranks.
5. ROC-AUC/MRR per rank, then averaged over ranks: not the ROC-AUC of the whole set.
                                                -> ``LinkScores``: each rank keeps its
                                                   scores; ``compute`` gathers them and
                                                   computes the metrics once.
6. The batch size for weighted epoch means is the number of seed edges, not the number
   of input nodes (several times more).         -> inferred from the pair graph.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphtrainer import GraphTask, ModelCheckpoint  # noqa: E402
from graphtrainer.models import LinkPredictor  # noqa: E402
from graphtrainer.evaluation.ranking import LinkScores, ranking_metrics  # noqa: E402
from tutorials.config_cli import TutorialCLI  # noqa: E402
from tutorials.summary import report  # noqa: E402


class LinkPrediction(GraphTask):
    """GraphSAGE + dot-product link prediction: everything a researcher writes."""

    def __init__(self, dataset: str = "cora", fanouts: Sequence[int] = (10, 10), hidden: int = 128,
                 lr: float = 5e-3, batch_size: int = 512, eval_batch_size: int = 512, eval_negatives: int = 20,
                 split_seed: int = 0):
        super().__init__()
        self.save_hyperparameters("dataset", "fanouts", "hidden", "lr", "batch_size", "eval_negatives", "split_seed")
        from graphtrainer import datasets

        graph = datasets.load(dataset)                 # offline: ../shared/datasets
        self.dataset, self.source_size = dataset, (graph.num_nodes(), graph.num_edges())
        split = datasets.link_split(graph, val_frac=0.05, test_frac=0.10, seed=split_seed)
        self.graph = split.graph                       # training edges only, both directions
        self.split = split
        self.fanouts, self.hidden, self.lr = list(fanouts), hidden, lr
        self.batch_size, self.eval_batch_size, self.eval_negatives = batch_size, eval_batch_size, eval_negatives

    def configure_model(self) -> torch.nn.Module:
        return LinkPredictor(self.graph.ndata["feat"].shape[1], self.hidden, num_layers=len(self.fanouts))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    # Classic step 2: each undirected training edge once per epoch; the edge and its reverse
    # are kept out of the blocks sampled for it (no leak of the answer into the input).
    def train_dataloader(self) -> Any:
        return self.edge_dataloader(self.split.train_eids, self.fanouts, self.batch_size, negatives=1,
                                    exclude="reverse_id", reverse_eids=self.split.reverse_eids)

    # Classic step 3: held-out pairs, every neighbour, 20 negatives per edge.
    def _eval_loader(self, pairs: Any) -> Any:
        import dgl

        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(self.fanouts), prefetch_node_feats=["feat"])
        return self.edge_dataloader(pairs, sampler, self.eval_batch_size, negatives=self.eval_negatives,
                                    shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader(self.split.val)

    def test_dataloader(self) -> Any:
        return self._eval_loader(self.split.test)

    predict_dataloader = test_dataloader

    def _scores(self, batch: Any) -> tuple:
        input_nodes, pos_graph, neg_graph, blocks = batch   # what DGL's edge loader yields
        return self.model(blocks, blocks[0].srcdata["feat"], pos_graph, neg_graph)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pos, neg = self._scores(batch)
        loss = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
                + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg)))
        self.log("train_loss", loss)                  # weighted by the batch's seed edges
        return loss

    # Classic step 5: keep the scores; compute the metrics once over every rank's scores.
    def on_validation_epoch_start(self) -> None:
        self.scores = LinkScores(self.eval_negatives, hits=(20,))

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.scores.add(*self._scores(batch))

    test_step = validation_step

    def on_validation_epoch_end(self) -> None:
        for name, value in self.scores.compute("val_").items():   # collective: all ranks
            self.log(name, value)                                  # same value on every rank

    def on_test_epoch_end(self) -> None:
        for name, value in self.scores.compute("test_").items():
            self.log(name, value)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pos, neg = self._scores(batch)
        # One row per test pair: its score, then the scores of its own negatives.
        return torch.cat([pos.unsqueeze(1), neg.reshape(pos.numel(), -1)], 1)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    # Trainer and task arguments from 07_link_prediction.yaml (beside this file), any key
    # overridden on the command line (--task.dataset citeseer, --trainer.max_epochs 5).
    started = time.time()
    cli = TutorialCLI(__file__, fast_epochs=4, argv=argv, description=__doc__.split("\n")[0],
                      task_class=LinkPrediction)
    trainer, task = cli.trainer, cli.task
    split = task.split
    print(f"{task.dataset}: {task.source_size[0]} nodes, {task.source_size[1]} directed edges; {split}", flush=True)
    ckpt = next(cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint))
    t0 = time.time()
    trainer.fit(task)
    fit_s = time.time() - t0
    print(f"fit: {trainer.current_epoch} epochs in {fit_s:.1f} s; best val_auc {ckpt.best_model_score:.4f} "
          f"({Path(ckpt.best_model_path).name})", flush=True)

    test = trainer.test(task, ckpt_path="best")
    print(f"test (best checkpoint, {trainer.num_procs} ranks, exact over {int(test['test_edges'])} edges): "
          f"roc_auc {test['test_auc']:.4f}  ap {test['test_ap']:.4f}  mrr {test['test_mrr']:.4f}  "
          f"pooled_hits@20 {test['test_pooled_hits@20']:.4f}", flush=True)

    # predict: one row per test pair, in the order of split.test; the metrics recomputed
    # from those rows in this process equal the ranks' exact ones.
    rows = trainer.predict(task, ckpt_path="best")
    again = ranking_metrics(rows[:, 0], rows[:, 1:], hits=(20,))
    print(f"predict: {rows.shape[0]} rows x {rows.shape[1]} scores; roc_auc recomputed here {again['auc']:.4f}, "
          f"mrr {again['mrr']:.4f}", flush=True)

    result = {
        "tutorial": "07_link_prediction", "dataset": task.dataset, "num_procs": trainer.num_procs,
        "epochs": trainer.current_epoch, "train_edges": int(split.train_eids.numel()),
        "val_edges": int(trainer.history[-1]["val_edges"]), "test_edges": int(test["test_edges"]),
        "final_train_loss": trainer.history[-1]["train_loss"], "best_val_auc": ckpt.best_model_score,
        "test_auc": test["test_auc"], "test_ap": test["test_ap"], "test_mrr": test["test_mrr"],
        "test_pooled_hits@20": test["test_pooled_hits@20"], "predict_rows": int(rows.shape[0]),
        "predict_auc": again["auc"], "predict_mrr": again["mrr"], "checkpoint": ckpt.best_model_path,
        "fit_seconds": round(fit_s, 1), "seconds": round(time.time() - started, 1),
    }
    report(result, cli.config.out)
    return result


if __name__ == "__main__":
    main()
