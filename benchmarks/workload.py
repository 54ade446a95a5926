"""What the benchmarks train: graph sizes (``NODESxDEGREE``), the graphs themselves, and the
GraphTask (the example's, train only)."""
from __future__ import annotations

import argparse
from typing import Any, Dict

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer.examples.node_classification import NodeClassification

DATASETS = ("synthetic", "tolokers")


def parse_size(text: str) -> Dict[str, int]:
    """``NODESxDEGREE`` with k/M suffixes, e.g. ``2Mx10`` (2,000,000 nodes, ~20M edges)."""
    def num(s: str) -> int:
        s = s.strip()
        mult = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(s[-1:], 1)
        return int(float(s[:-1] if mult > 1 else s) * mult)

    try:
        nodes, _, deg = text.partition("x")
        out = {"num_nodes": num(nodes), "avg_degree": int(deg) if deg else 10}
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use NODESxDEGREE, e.g. 2Mx10") from None
    if out["num_nodes"] < 100 or out["avg_degree"] < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: need at least 100 nodes and degree 1")
    return out


def size_label(size: Dict[str, int]) -> str:
    n = size["num_nodes"]
    text = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"
    return f"{text}x{size['avg_degree']}"


def build_graph(spec: Dict[str, Any]) -> Any:
    """``spec``: ``{"dataset": "tolokers"}`` or ``{"dataset": "synthetic", num_nodes, avg_degree,
    feat_dim, num_classes, seed}``. Tolokers' features are standardized as the example does."""
    from graphtrainer import datasets

    if spec["dataset"] == "tolokers":
        graph = datasets.load("tolokers")
        from graphtrainer.examples.node_classification import standardize_features

        standardize_features(graph)
        return single_split(graph)
    if spec["dataset"] == "synthetic":
        return datasets.synthetic(spec["num_nodes"], spec["avg_degree"], spec["feat_dim"],
                                  spec.get("num_classes", 8), spec.get("seed", 0))
    raise ValueError(f"unknown dataset {spec['dataset']!r}: choose one of {DATASETS}")


def split_ids(graph: Any, split: str) -> Any:
    mask = graph.ndata[f"{split}_mask"]
    if mask.dim() > 1:
        mask = mask[:, 0]
    return mask.nonzero(as_tuple=True)[0]


def single_split(graph: Any) -> Any:
    """Make ``*_mask`` 1-D (split 0 of Tolokers' 10) so the example task can use the graph."""
    for s in ("train", "val", "test"):
        m = graph.ndata[f"{s}_mask"]
        if m.dim() > 1:
            graph.ndata[f"{s}_mask"] = m[:, 0].contiguous()
    return graph


class BenchTask(NodeClassification):
    """The example's GraphSAGE task (``graphtrainer.examples.node_classification``) without
    validation (the benchmarks time training only), and with a training step that does
    exactly what the hand-written loop's step does: forward, cross-entropy, and the loss
    recorded once (``self.log`` here, ``loss.item()`` there); the example also logs a
    training accuracy, which the hand-written loop does not compute."""

    def val_dataloader(self) -> Any:
        return None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        import torch.nn.functional as F

        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)
        return loss
