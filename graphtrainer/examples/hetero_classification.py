"""Node classification on a heterograph (papers and words) as a ``GraphTask``, evaluated
with sampled neighbourhoods and, optionally, with full neighbourhoods layer by layer."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from .. import GraphTask
from ..data.inference import layerwise
from ..evaluation.ranking import accuracy
from graphtrainer.examples.node_classification import CrossEntropySteps
from graphtrainer.models import HeteroSAGE


class HeteroClassification(CrossEntropySteps, GraphTask):
    """:class:`~graphtrainer.models.HeteroSAGE` on the ``target`` nodes of a heterograph
    whose target type has ``feat``, ``label`` and ``{train,val,test}_mask`` (e.g.
    :func:`graphtrainer.datasets.cora_hetero`); featureless types get learned embeddings.

    Training and evaluation sample ``fanouts`` neighbours per layer and relation
    (``{split}_acc``, ``_loss``, ``_nodes``). With ``layerwise_eval`` validation and test also
    log ``{split}_acc_full`` from every node's full-neighbourhood output
    (:func:`~graphtrainer.data.inference.layerwise`); ``predict`` returns those class
    probabilities for the test nodes.

    The model's last layer has relations into the other types, which no target seed uses:
    train with ``Trainer(find_unused_parameters=True)``.
    """

    def __init__(self, graph: Any, target: str = "paper", fanouts: Sequence[int] = (10, 10), hidden: int = 64,
                 embed_dim: int = 64, dropout: float = 0.5, lr: float = 1e-2, weight_decay: float = 5e-4,
                 batch_size: int = 32, eval_batch_size: int = 512, layerwise_eval: bool = True,
                 aggregate: str = "sum"):
        super().__init__()
        self.save_hyperparameters()
        self.graph, self.target = graph, target
        self.fanouts, self.hidden, self.embed_dim, self.dropout = list(fanouts), hidden, embed_dim, dropout
        self.lr, self.weight_decay, self.aggregate = lr, weight_decay, aggregate
        self.batch_size, self.eval_batch_size, self.layerwise_eval = batch_size, eval_batch_size, layerwise_eval
        data = graph.nodes[target].data
        self.num_classes = int(data["label"].max()) + 1
        self.split_ids = {s: data[f"{s}_mask"].nonzero(as_tuple=True)[0] for s in ("train", "val", "test")}
        self._full: Optional[Dict[str, torch.Tensor]] = None

    def configure_model(self) -> torch.nn.Module:
        g = self.graph
        in_feats = {nt: g.nodes[nt].data["feat"].shape[1] for nt in g.ntypes if "feat" in g.nodes[nt].data}
        return HeteroSAGE(g.canonical_etypes, {nt: g.num_nodes(nt) for nt in g.ntypes}, in_feats, self.hidden,
                          self.num_classes, num_layers=len(self.fanouts), dropout=self.dropout,
                          embed_dim=self.embed_dim, aggregate=self.aggregate)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def _loader(self, split: str, shuffle: bool) -> Any:
        size = self.batch_size if shuffle else self.eval_batch_size
        return self.node_dataloader({self.target: self.split_ids[split]}, self.fanouts, size, shuffle=shuffle)

    def train_dataloader(self) -> Any:
        return self._loader("train", True)

    def val_dataloader(self) -> Any:
        return self._loader("val", False)

    def test_dataloader(self) -> Any:
        return self._loader("test", False)

    def predict_dataloader(self) -> Any:
        return self._loader("test", False)

    def _forward(self, batch: Any) -> tuple:
        _, _, blocks = batch
        first = blocks[0]  # per-type views: the same code for one node type or several (DGL or torch blocks)
        feats = {nt: first.srcnodes[nt].data["feat"] for nt in first.srctypes if "feat" in first.srcnodes[nt].data}
        out = self.model(blocks, feats)
        return out[self.target], blocks[-1].dstnodes[self.target].data["label"]

    def _eval_step(self, batch: Any, prefix: str) -> None:
        self._log_eval(*self._forward(batch), prefix)

    def full_outputs(self) -> Dict[str, torch.Tensor]:
        """Every node's logits with full neighbourhoods (collective: call on every rank)."""
        model = self.module
        return layerwise(model, self.graph, model.input_features(self.graph), batch_size=self.eval_batch_size)

    def _eval_epoch_end(self, prefix: str) -> None:
        if not self.layerwise_eval:
            return
        logits = self.full_outputs()[self.target]
        ids = self.split_ids["val" if prefix == "val" else "test"]
        labels = self.graph.nodes[self.target].data["label"][ids]
        # Every rank holds the whole result: each logs the same value, so the mean is it.
        self.log(f"{prefix}_acc_full", accuracy(logits[ids], labels), batch_size=1)

    def on_predict_epoch_start(self) -> None:
        self._full = self.full_outputs()  # once; predict_step picks each batch's rows

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        seeds = batch[1][self.target]
        return torch.softmax(self._full[self.target][seeds], dim=-1)
