"""Tasks for the edge and graph loader tests, at module level so spawned ranks import them.

- :class:`LinkTask`: link prediction with :class:`graphtrainer.models.LinkPredictor` over
  ``edge_dataloader``; exact ranking metrics from :class:`graphtrainer.evaluation.ranking.LinkScores`.
- :class:`GraphClsTask`: graph classification with
  :class:`graphtrainer.models.GraphClassifier` over ``graph_dataloader``.

Both can record what each rank saw (``record_dir``) so tests can check exactness.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import torch
import torch._dynamo  # noqa: F401  (imported once here, inherited by forked ranks)
import torch.nn.functional as F
from torch import nn

from graphtrainer import GraphTask


def _full(num_layers: int) -> Any:
    import dgl

    return dgl.dataloading.MultiLayerFullNeighborSampler(num_layers, prefetch_node_feats=["feat"])


def rand_link_graph(num_nodes: int = 120, num_edges: int = 200, feat_dim: int = 8, seed: int = 0) -> Any:
    """A random graph whose first ``num_edges`` edges have their reverses as the next ones."""
    import dgl

    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = (src + 1 + torch.randint(0, num_nodes - 1, (num_edges,), generator=gen)) % num_nodes
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=num_nodes)
    g.ndata["feat"] = torch.randn(num_nodes, feat_dim, generator=gen)
    return g


def symmetric_graph(n: int = 60, m: int = 300, seed: int = 0) -> Any:
    """``(graph, reverse_eids)``: ``m`` random edges, then their reverses as the next ``m``."""
    import dgl

    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=n)
    g.ndata["feat"] = torch.randn(n, 4, generator=gen)
    return g, torch.cat([torch.arange(m, 2 * m), torch.arange(m)])


class LinkTask(GraphTask):
    """Link prediction: training over edge ids of ``graph`` (with ``exclude``), evaluation
    over node pairs ``val``/``test`` (or edge ids) with ``eval_negatives`` per edge."""

    def __init__(self, graph: Any, train_eids: torch.Tensor, val: Any, test: Any = None, *,
                 reverse_eids: Optional[torch.Tensor] = None, exclude: Optional[str] = None,
                 fanouts: Sequence[int] = (10, 10), hidden: int = 64, batch_size: int = 256,
                 eval_batch_size: int = 256, negatives: int = 1, eval_negatives: int = 20,
                 lr: float = 1e-2, optimizer: str = "adam", dropout: float = 0.0,
                 full_train_sampler: bool = False, train_even: Optional[str] = None,
                 record_dir: Optional[str] = None):
        super().__init__()
        self.save_hyperparameters("fanouts", "hidden", "batch_size", "negatives", "lr")
        self.graph, self.train_eids, self.val, self.test = graph, train_eids, val, test
        self.reverse_eids, self.exclude = reverse_eids, exclude
        self.fanouts, self.hidden, self.dropout = list(fanouts), hidden, dropout
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.negatives, self.eval_negatives = negatives, eval_negatives
        self.lr, self.optimizer, self.full_train_sampler = lr, optimizer, full_train_sampler
        self.train_even, self.record_dir = train_even, record_dir
        self.seen: list = []

    def configure_model(self) -> nn.Module:
        from graphtrainer.models import LinkPredictor

        return LinkPredictor(self.graph.ndata["feat"].shape[1], self.hidden, num_layers=len(self.fanouts),
                             dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=self.lr)
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        sampler = _full(len(self.fanouts)) if self.full_train_sampler else self.fanouts
        if self.train_even is not None:  # "none": ranks may get different batch counts (Join)
            from graphtrainer.data.edge_loader import EdgeLoader

            return EdgeLoader(self.graph, self.train_eids, sampler, self.batch_size, negatives=self.negatives,
                              exclude=self.exclude, reverse_eids=self.reverse_eids, even=self.train_even,
                              seed=self.trainer.seed)
        return self.edge_dataloader(self.train_eids, sampler, self.batch_size, negatives=self.negatives,
                                    exclude=self.exclude, reverse_eids=self.reverse_eids)

    def _eval_loader(self, edges: Any) -> Any:
        return self.edge_dataloader(edges, _full(len(self.fanouts)), self.eval_batch_size,
                                    negatives=self.eval_negatives, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader(self.val) if self.val is not None else None

    def test_dataloader(self) -> Any:
        return self._eval_loader(self.test)

    def predict_dataloader(self) -> Any:
        return self._eval_loader(self.test)

    def _scores(self, batch: Any) -> tuple:
        _, pos, neg, blocks = batch
        return self.model(blocks, blocks[0].srcdata["feat"], pos, neg)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ps, ns = self._scores(batch)
        loss = (F.binary_cross_entropy_with_logits(ps, torch.ones_like(ps))
                + F.binary_cross_entropy_with_logits(ns, torch.zeros_like(ns)))
        self.log("train_loss", loss)
        return loss

    def on_validation_epoch_start(self) -> None:
        from graphtrainer.evaluation.ranking import LinkScores

        self.scores = LinkScores(self.eval_negatives, hits=(20,))

    on_test_epoch_start = on_validation_epoch_start

    def _eval(self, batch: Any, prefix: str) -> None:
        import dgl

        ps, ns = self._scores(batch)
        self.scores.add(ps, ns)
        pos = batch[1]
        self.log(f"{prefix}_loss", F.binary_cross_entropy_with_logits(ps, torch.ones_like(ps)))
        if self.record_dir is not None:
            nid = pos.ndata[dgl.NID]
            s, d = pos.edges()
            self.seen += torch.stack([nid[s], nid[d]], 1).tolist()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")

    def _end(self, prefix: str) -> None:
        for name, value in self.scores.compute(f"{prefix}_").items():
            self.log(name, value)  # the same value on every rank: its mean is itself
        if self.record_dir is not None:
            path = os.path.join(self.record_dir, f"{prefix}_seen_r{self.rank}.json")
            with open(path, "w") as fh:
                json.dump(self.seen, fh)
        self.seen = []

    def on_validation_epoch_end(self) -> None:
        self._end("val")

    def on_test_epoch_end(self) -> None:
        self._end("test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import dgl

        ps, _ = self._scores(batch)
        pos = batch[1]
        nid = pos.ndata[dgl.NID]
        s, d = pos.edges()
        # The pair itself beside its score, so tests can check the order of the rows.
        return torch.stack([nid[s].float(), nid[d].float(), torch.sigmoid(ps)], 1)


class GraphClsTask(GraphTask):
    """Graph classification over a :class:`graphtrainer.data.graph_loader.PackedGraphs`."""

    def __init__(self, graphs: Any, train_idx: Any = None, val_idx: Any = None, test_idx: Any = None, *,
                 hidden: int = 32, batch_size: int = 32, eval_batch_size: int = 64, lr: float = 1e-2,
                 optimizer: str = "adam", num_classes: Optional[int] = None, train_even: Optional[str] = None,
                 record_dir: Optional[str] = None):
        super().__init__()
        from graphtrainer.data.graph_loader import PackedGraphs

        self.save_hyperparameters("hidden", "batch_size", "lr")
        # Packed once here: a few flat tensors travel to the ranks (shared memory with spawn).
        self.graphs = graphs if isinstance(graphs, PackedGraphs) else PackedGraphs(graphs)
        self.train_idx, self.val_idx, self.test_idx = train_idx, val_idx, test_idx
        self.hidden, self.batch_size, self.eval_batch_size = hidden, batch_size, eval_batch_size
        self.lr, self.optimizer, self.record_dir = lr, optimizer, record_dir
        self.train_even = train_even
        self.num_classes = num_classes or int(self.graphs.labels.max()) + 1
        self.seen: list = []

    def configure_model(self) -> nn.Module:
        from graphtrainer.models import GraphClassifier

        return GraphClassifier(self.graphs.ndata["feat"].shape[1], self.hidden, self.num_classes)

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=self.lr)
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        if self.train_even is not None:  # "none": ranks may get different batch counts (Join)
            from graphtrainer.data.graph_loader import GraphLoader

            return GraphLoader(self.graphs, self.batch_size, self.train_idx, even=self.train_even,
                               seed=self.trainer.seed)
        return self.graph_dataloader(self.graphs, self.batch_size, self.train_idx)

    def val_dataloader(self) -> Any:
        if self.val_idx is None:
            return None
        return self.graph_dataloader(self.graphs, self.eval_batch_size, self.val_idx, shuffle=False)

    def test_dataloader(self) -> Any:
        return self.graph_dataloader(self.graphs, self.eval_batch_size, self.test_idx, shuffle=False)

    predict_dataloader = test_dataloader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        graph, labels = batch
        logits = self.model(graph, graph.ndata["feat"])
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)
        return loss

    def _eval(self, batch: Any, prefix: str) -> None:
        graph, labels = batch
        logits = self.model(graph, graph.ndata["feat"])
        self.log(f"{prefix}_loss", F.cross_entropy(logits, labels))
        self.log(f"{prefix}_acc", (logits.argmax(1) == labels).float().mean())
        self.log(f"{prefix}_graphs", labels.numel(), reduce_fx="sum")
        if self.record_dir is not None and "gid" in graph.ndata:
            import dgl

            self.seen += dgl.max_nodes(graph, "gid").long().tolist()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")

    def on_test_epoch_end(self) -> None:
        if self.record_dir is not None:
            with open(os.path.join(self.record_dir, f"test_seen_r{self.rank}.json"), "w") as fh:
                json.dump(self.seen, fh)
        self.seen = []

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import dgl

        graph, labels = batch
        logits = self.model(graph, graph.ndata["feat"])
        gid = dgl.max_nodes(graph, "gid") if "gid" in graph.ndata else torch.zeros(labels.numel())
        # The graph's own id beside its class probabilities, so tests can check the order.
        return torch.cat([gid.reshape(-1, 1).float(), torch.softmax(logits, -1)], 1)


def numbered_minigc(num_graphs: int, seed: int = 0) -> list:
    """MiniGC graphs whose nodes carry ``ndata["gid"]``, the graph's index (for order checks)."""
    from graphtrainer.datasets import minigc

    out = []
    for i, (g, y) in enumerate(minigc(num_graphs, 10, 14, seed=seed)):
        g.ndata["gid"] = torch.full((g.num_nodes(),), float(i))
        out.append((g, y))
    return out


class DGLEdgeLoaderTask(LinkTask):
    """Training batches from DGL's own edge loader with ``use_ddp=True`` (the loader the
    issue reported as rejected); logs a probe whose weighted mean reveals the batch weights."""

    def train_dataloader(self) -> Any:
        import dgl

        sampler = dgl.dataloading.as_edge_prediction_sampler(
            _full(len(self.fanouts)), negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
        return dgl.dataloading.DataLoader(self.graph, self.train_eids, sampler, batch_size=self.batch_size,
                                          use_ddp=True, shuffle=True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # Weighted by the inferred batch size n: the epoch value is sum(n * n) / sum(n).
        self.log("probe", float(batch[1].num_edges()))
        self.log("edges_seen", batch[1].num_edges(), reduce_fx="sum")
        return super().training_step(batch, batch_idx)
