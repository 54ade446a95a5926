"""A heterograph task whose featureless ``word`` type uses a shared :class:`SparseEmbedding`
(module level, so spawned ranks can import it)."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

import torch

from graphtrainer.nn.sparse_embedding import SparseAdagrad, SparseAdam, SparseEmbedding

from hetero_tasks import CLASSES, HeteroTask


class SparseHeteroTask(HeteroTask):
    """``HeteroTask`` with ``word`` rows from one shared table. ``optimizer``: "adagrad",
    "adam", "dense-only" (no sparse optimizer) or "dense-table" (the table given to a
    torch.optim optimizer), the last two refused before any rank starts; ``rows``: the
    table's rows (default: the word count); ``record_dir``: each rank writes the sum of its
    view of the table at the end of fit."""

    def __init__(self, graph: Any, ids: Dict[str, torch.Tensor], batch_size: int, optimizer: str = "adagrad",
                 rows: Optional[int] = None, sparse_lr: float = 0.1, **kwargs: Any):
        super().__init__(graph, ids, batch_size, **kwargs)
        self.word_emb = SparseEmbedding(rows or graph.num_nodes("word"), 8, ntype="word", seed=5)
        self.optimizer, self.sparse_lr = optimizer, sparse_lr

    def configure_model(self) -> Any:
        from graphtrainer.models import HeteroSAGE

        g = self.graph
        return HeteroSAGE(g.canonical_etypes, {nt: g.num_nodes(nt) for nt in g.ntypes},
                          {"paper": g.nodes["paper"].data["feat"].shape[1]}, 8, CLASSES, dropout=0.0,
                          sparse_embeddings={"word": self.word_emb})

    def configure_optimizers(self) -> Any:
        dense = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        if self.optimizer == "dense-only":
            return dense
        if self.optimizer == "dense-table":
            return [dense, torch.optim.Adam([self.word_emb.weight], lr=self.sparse_lr)]
        sparse = (SparseAdam if self.optimizer == "adam" else SparseAdagrad)([self.word_emb], lr=self.sparse_lr)
        return [dense, sparse]

    def on_fit_end(self) -> None:
        if self.record_dir is not None:
            torch.save(self.word_emb.weight.clone(), os.path.join(self.record_dir, f"table_r{self.rank}.pt"))
