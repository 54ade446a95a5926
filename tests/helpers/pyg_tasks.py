"""Node classification and link prediction with PyG's models on ``batch_format="pyg"`` batches,
at module level so spawned ranks import them. Each is the DGL-format task of the same test
(graphtrainer.examples.node_classification, link_tasks.LinkTask) with only the model and the
step's reading of the batch changed, so their metrics compare."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphtrainer import GraphTask
from graphtrainer.examples.node_classification import NodeClassification

from link_tasks import LinkTask


class PygNodeClassification(NodeClassification):
    """``model="graphsage"`` (``torch_geometric.nn.GraphSAGE``) or ``"gcn"`` (``GCN``); the step is
    PyG's tutorial's: ``model(batch.x, batch.edge_index)[:batch.batch_size]``."""

    batch_format = "pyg"

    def __init__(self, graph: Any, model: str = "graphsage", **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.model_name = model

    def configure_model(self) -> nn.Module:
        from torch_geometric.nn import GCN, GraphSAGE

        kind = {"graphsage": GraphSAGE, "gcn": GCN}[self.model_name]
        return kind(self.in_feats, self.hidden, num_layers=len(self.fanouts), out_channels=self.num_classes,
                    dropout=self.dropout)

    def _forward(self, batch: Any) -> tuple:
        return self.model(batch.x, batch.edge_index)[:batch.batch_size], batch.y[:batch.batch_size]


class PygLinkPredictor(nn.Module):
    """PyG's GraphSAGE encoder and a dot-product score of each ``edge_label_index`` pair.

    Its weights start as DGL's ``SAGEConv`` (and graphtrainer's) start them, Xavier-uniform with
    ReLU's gain, so that the test compares batch formats, not initialisations: with PyG's own
    (about 3x smaller on Cora's 1,433 inputs) the dot-product scores grow slowly and 20 epochs
    reached test ROC-AUC 0.84-0.85 where this reaches 0.91, as the DGL format does."""

    def __init__(self, in_feats: int, hidden: int, num_layers: int, dropout: float):
        super().__init__()
        from torch_geometric.nn import GraphSAGE

        self.encoder = GraphSAGE(in_feats, hidden, num_layers=num_layers, dropout=dropout)
        for conv in self.encoder.convs:
            for lin in (conv.lin_l, conv.lin_r):
                nn.init.xavier_uniform_(lin.weight, gain=nn.init.calculate_gain("relu"))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_label_index: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x, edge_index)
        return (h[edge_label_index[0]] * h[edge_label_index[1]]).sum(-1)


class PygLinkTask(LinkTask):
    """LinkTask on PyG's ``LinkNeighborLoader``-style batches (``edge_label_index``, ``edge_label``)."""

    batch_format = "pyg"

    def configure_model(self) -> nn.Module:
        return PygLinkPredictor(self.graph.ndata["feat"].shape[1], self.hidden, len(self.fanouts), self.dropout)

    def _scores(self, batch: Any) -> tuple:
        scores = self.model(batch.x, batch.edge_index, batch.edge_label_index)
        positive = batch.edge_label == 1
        return scores[positive], scores[~positive]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        scores = self.model(batch.x, batch.edge_index, batch.edge_label_index)
        loss = F.binary_cross_entropy_with_logits(scores, batch.edge_label)
        self.log("train_loss", loss)
        return loss

    def _eval(self, batch: Any, prefix: str) -> None:
        ps, ns = self._scores(batch)
        self.scores.add(ps, ns)  # negatives in the loader's order: k per positive, as the DGL format
        self.log(f"{prefix}_loss", F.binary_cross_entropy_with_logits(ps, torch.ones_like(ps)))


def own_pyg_data(seed: int = 0, n: int = 240, m: int = 1600, classes: int = 3) -> Any:
    """A PyG user's own ``Data``: ``x``, ``y`` (learnable from ``x``), ``edge_index``, ``edge_attr``
    and ``train_mask``, under PyG's names."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    y = (x @ torch.randn(8, classes, generator=gen)).argmax(1)
    edge_index = torch.randint(0, n, (2, m), generator=gen)
    return Data(x=x, y=y, edge_index=edge_index, edge_attr=torch.randn(m, 2, generator=gen),
                train_mask=torch.rand(n, generator=gen) < 0.5)


class OwnPygDataTask(GraphTask):
    """What a PyG user writes: the graph is ``to_dgl(data)`` (PyG's names kept), the model
    ``torch_geometric.nn.GraphSAGE`` and the step PyG's, reading ``batch.x`` and ``batch.y``,
    no key named. Each step also logs how many of its rows differ from ``data``'s."""

    batch_format = "pyg"

    def __init__(self, data: Any):
        super().__init__()
        from torch_geometric.utils import to_dgl

        self.graph = to_dgl(data)
        self.x, self.y = data.x, data.y
        self.train_ids = data.train_mask.nonzero(as_tuple=True)[0]
        self.num_classes = int(data.y.max()) + 1

    def configure_model(self) -> nn.Module:
        from torch_geometric.nn import GraphSAGE

        return GraphSAGE(self.x.shape[1], 16, num_layers=2, out_channels=self.num_classes)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=0.02)

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.train_ids, [4, 4], 16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        seeds = batch.n_id[:batch.batch_size]
        wrong = int((batch.x != self.x[batch.n_id]).any(1).sum()) + int((batch.y != self.y[batch.n_id]).sum())
        self.log("wrong_rows", wrong, reduce_fx="sum")
        self.log("seeds_seen", batch.batch_size, reduce_fx="sum")
        self.log("non_train_seeds", int((~torch.isin(seeds, self.train_ids)).sum()), reduce_fx="sum")
        out = self.model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        self.log("train_loss", loss)
        return loss


def masked_pyg_data(seed: int = 0) -> Any:
    """:func:`own_pyg_data` with more of what a PyG user's ``Data`` holds: ``val_mask``, a node
    ``year`` and an ``edge_weight``."""
    data = own_pyg_data(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    data.val_mask = ~data.train_mask
    data.year = torch.randint(2000, 2024, (data.num_nodes,), generator=gen)
    data.edge_weight = torch.rand(data.num_edges, generator=gen)
    return data


class MaskedPygDataTask(OwnPygDataTask):
    """:class:`OwnPygDataTask` whose step reads the Data's other attributes off the batch, as a
    PyG step does (``batch.train_mask[:batch.batch_size]``, ``batch.edge_weight``), logging the
    rows that differ from ``data``'s."""

    def __init__(self, data: Any):
        super().__init__(data)
        self.node_attrs = {k: data[k] for k in ("train_mask", "val_mask", "year")}
        self.edge_weight = data.edge_weight

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        wrong = sum(int((batch[k] != v[batch.n_id]).sum()) for k, v in self.node_attrs.items())
        wrong += int((batch.edge_weight != self.edge_weight[batch.e_id]).sum())
        self.log("wrong_attr_rows", wrong, reduce_fx="sum")
        self.log("unmasked_seeds", int((~batch.train_mask[:batch.batch_size]).sum()), reduce_fx="sum")
        return super().training_step(batch, batch_idx)
