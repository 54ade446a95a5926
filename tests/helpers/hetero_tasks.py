"""Tasks for the heterograph, worker and layer-wise inference tests (module level, so
spawned ranks can import them)."""
from __future__ import annotations

import json
import os
import signal
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from graphtrainer import GraphTask

CLASSES = 4


def make_hetero(num_papers: int = 80, num_words: int = 32, seed: int = 0) -> Any:
    """A small paper/word heterograph; words get labels too (word id mod classes), so
    seeds of both types can carry a loss."""
    from graphtrainer.datasets import synthetic_hetero

    g = synthetic_hetero(num_papers, num_words, avg_degree=4, words_per_paper=3, feat_dim=8,
                         num_classes=CLASSES, seed=seed)
    g.nodes["word"].data["label"] = torch.arange(num_words) % CLASSES
    return g


def hetero_model(graph: Any, hidden: int = 8) -> Any:
    from graphtrainer.models import HeteroSAGE

    return HeteroSAGE(graph.canonical_etypes, {nt: graph.num_nodes(nt) for nt in graph.ntypes},
                      {"paper": graph.nodes["paper"].data["feat"].shape[1]}, hidden, CLASSES,
                      dropout=0.0, embed_dim=8)


class HeteroTask(GraphTask):
    """HeteroSAGE on ``{ntype: ids}`` seeds; the loss is the mean over every labelled seed of
    the batch (all types together). ``fail``: ``("raise" | "kill", rank, step)``.
    ``record_dir``: each rank writes the seeds it trained on per epoch."""

    def __init__(self, graph: Any, ids: Dict[str, torch.Tensor], batch_size: int,
                 fanouts: Sequence[int] = (-1, -1), lr: float = 0.5, loader_kwargs: Optional[dict] = None,
                 fail: Optional[tuple] = None, record_dir: Optional[str] = None):
        super().__init__()
        self.graph, self.ids, self.batch_size = graph, ids, batch_size
        self.fanouts, self.lr = list(fanouts), lr
        self.loader_kwargs = dict(loader_kwargs or {})
        self.fail, self.record_dir = fail, record_dir
        self.seen: list = []

    def configure_model(self) -> Any:
        return hetero_model(self.graph)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.ids, self.fanouts, self.batch_size, **self.loader_kwargs)

    def val_dataloader(self) -> Any:
        return self.node_dataloader(self.ids, self.fanouts, self.batch_size, **self.loader_kwargs)

    def _loss_acc(self, batch: Any) -> tuple:
        _, output_nodes, blocks = batch
        x = {"paper": blocks[0].srcdata["feat"]["paper"]}
        out = self.model(blocks, x)
        types = [nt for nt in output_nodes if output_nodes[nt].numel()]
        logits = torch.cat([out[nt] for nt in types])
        labels = torch.cat([blocks[-1].dstdata["label"][nt] for nt in types])
        return F.cross_entropy(logits, labels), (logits.argmax(-1) == labels).float().mean()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail is not None and self.rank == self.fail[1] and self.global_step >= self.fail[2]:
            if self.fail[0] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("planned failure in training_step")
        self.seen += [[nt, int(i)] for nt, ids in batch[1].items() for i in ids]
        loss, acc = self._loss_acc(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, acc = self._loss_acc(batch)
        self.log("val_loss", loss)
        self.log("val_acc", acc)
        self.log("val_seeds", float(sum(v.numel() for v in batch[1].values())), reduce_fx="sum")

    def on_train_epoch_end(self) -> None:
        if self.record_dir is not None:
            with open(os.path.join(self.record_dir, f"seen_r{self.rank}_e{self.current_epoch}.json"), "w") as fh:
                json.dump(self.seen, fh)
        self.seen = []


class LayerwiseTask(GraphTask):
    """Validates by comparing :func:`layerwise` with a full-graph forward in each rank and
    logging the largest difference, and a checksum of the result (equal on every rank)."""

    def __init__(self, graph: Any, hetero: bool, batch_size: int):
        super().__init__()
        self.graph, self.hetero, self.batch_size = graph, hetero, batch_size

    def configure_model(self) -> Any:
        from graphtrainer.models import SAGE

        if self.hetero:
            return hetero_model(self.graph)
        return SAGE(self.graph.ndata["feat"].shape[1], 8, CLASSES, num_layers=3, dropout=0.5)

    def val_dataloader(self) -> Any:
        ids = {"paper": torch.arange(4)} if self.hetero else torch.arange(4)
        return self.node_dataloader(ids, [-1] * len(self.module.layers), 2)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        from graphtrainer.data.inference import layerwise

        model = self.module
        g = self.graph
        x = model.input_features(g) if self.hetero else g.ndata["feat"]
        lw = layerwise(model, g, x, batch_size=self.batch_size)
        assert model.training is False  # the trainer's evaluation mode is kept
        with torch.no_grad():
            full = model([g] * len(model.layers), x)
        if not self.hetero:
            lw, full = {"_N": lw}, {"_N": full}
        diff = max(float((lw[nt] - full[nt]).abs().max()) for nt in full)
        self.log("lw_diff", diff, reduce_fx="sum")
        self.log("lw_checksum", float(sum(v.double().sum() for v in lw.values())), reduce_fx="sum")
        self.log("lw_ranks", 1.0, reduce_fx="sum")


class PidRecorder:
    """A ``worker_init_fn`` that writes each sampling worker's pid into ``out_dir``."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def __call__(self, worker_id: int) -> None:
        with open(os.path.join(self.out_dir, f"worker_{os.getpid()}.pid"), "w") as fh:
            fh.write(str(os.getpid()))


def worker_pids(out_dir: str) -> list:
    return [int(name.split("_")[1].split(".")[0]) for name in os.listdir(out_dir) if name.startswith("worker_")]


class SharingProbe(GraphTask):
    """Validation logs, per node type and relation, whether the rank's copy of the graph's
    tensors is in shared memory (1.0) and whether every relation's formats exist."""

    def __init__(self, graph: Any):
        super().__init__()
        self.graph = graph

    def configure_model(self) -> Any:
        return torch.nn.Linear(1, 1)

    def val_dataloader(self) -> Any:
        return self.node_dataloader({"paper": torch.arange(4)}, [2], 2)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        g = self.graph
        for nt in g.ntypes:
            for key, value in g.nodes[nt].data.items():
                self.log(f"shared_{nt}_{key}", float(value.is_shared()), reduce_fx="sum")
        for et in g.canonical_etypes:
            created = g.formats()["created"] if len(g.canonical_etypes) == 1 else g[et].formats()["created"]
            self.log(f"formats_{et[1]}", float(len(created)), reduce_fx="sum")


class HeteroLinkTask(GraphTask):
    """Link prediction on the ``cites`` edges of the paper/word graph: HeteroSAGE paper
    embeddings, dot-product scores, one negative per edge. Logs the seed edges trained on."""

    def __init__(self, graph: Any, batch_size: int):
        super().__init__()
        self.graph, self.batch_size = graph, batch_size

    def configure_model(self) -> Any:
        return hetero_model(self.graph)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=1e-2)

    def train_dataloader(self) -> Any:
        eids = torch.arange(self.graph.num_edges("cites"))
        return self.edge_dataloader({"cites": eids}, [3, 3], self.batch_size, negatives=1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, pos, neg, blocks = batch
        h = self.model(blocks, {"paper": blocks[0].srcdata["feat"]["paper"]})["paper"]
        et = ("paper", "cites", "paper")
        score = lambda g: (h[g.edges(etype=et)[0]] * h[g.edges(etype=et)[1]]).sum(-1)  # noqa: E731
        pos_s, neg_s = score(pos), score(neg)
        loss = F.binary_cross_entropy_with_logits(torch.cat([pos_s, neg_s]),
                                                  torch.cat([torch.ones_like(pos_s), torch.zeros_like(neg_s)]))
        self.log("train_loss", loss)
        self.log("train_edges", float(pos.num_edges(et)), reduce_fx="sum")
        return loss
