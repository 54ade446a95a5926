"""Porting a PyG link-prediction script: what its author passes to ``edge_dataloader``
(PyG's ``[2, E]`` ``edge_label_index``, training pairs that are edges of the graph) works, or is
refused naming the fix."""
from __future__ import annotations

import warnings

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer import GraphTask


def _task(n: int = 60, m: int = 300) -> GraphTask:
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)
    g = dgl.to_simple(dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=n))  # undirected, as PyG's
    g.ndata["x"] = torch.randn(n, 4, generator=gen)
    task = GraphTask()
    task.batch_format = "pyg"
    task.graph = g
    return task


def test_edge_label_index_tensor_is_pairs():
    task = _task()
    pairs = torch.randint(0, 60, (2, 25), generator=torch.Generator().manual_seed(1))
    label = torch.rand(25)
    as_tensor = list(task.edge_dataloader(pairs, [3, 3], 8, negatives=None, shuffle=False, edge_label=label))
    as_tuple = list(task.edge_dataloader((pairs[0], pairs[1]), [3, 3], 8, negatives=None, shuffle=False,
                                         edge_label=label))
    assert sum(b.batch_size for b in as_tensor) == 25
    for a, b in zip(as_tensor, as_tuple):  # the same seeds and pairs (outside a fit the draws are unseeded)
        seeds = a.num_sampled_nodes[0]
        assert torch.equal(a.input_id, b.input_id) and torch.equal(a.n_id[:seeds], b.n_id[:seeds])
        assert torch.equal(a.edge_label_index, b.edge_label_index)
        assert torch.equal(a.edge_label, label[a.input_id])
        assert torch.equal(a.n_id[a.edge_label_index], pairs[:, a.input_id])


def test_transposed_pairs_name_the_fix():
    task = _task()
    with pytest.raises(ValueError, match=r"\[2, E\].*\.t\(\)"):
        task.edge_dataloader(torch.randint(0, 60, (25, 2)), [3, 3], 8)


def test_exclude_with_pairs_names_edge_ids():
    task = _task()
    src, dst = task.graph.edges()
    with pytest.raises(ValueError, match=r"edge_ids\(src, dst\)"):
        task.edge_dataloader((src[:10], dst[:10]), [3, 3], 8, exclude="self")


def test_labelled_pairs_with_drawn_negatives_warn():
    """RandomLinkSplit's val/test pairs carry 0/1 labels; the default negatives=1 adds more and shifts them."""
    task = _task()
    pairs, label = tuple(torch.randint(0, 60, (2, 10))), torch.tensor([1.0, 0.0] * 5)
    with pytest.warns(UserWarning, match="negatives=None"):
        loader = task.edge_dataloader(pairs, [3, 3], 4, shuffle=False, edge_label=label)
    assert set(next(iter(loader)).edge_label.tolist()) == {0.0, 1.0, 2.0}  # PyG's rule, kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task.edge_dataloader(pairs, [3, 3], 4, shuffle=False, edge_label=label, negatives=None)
        task.edge_dataloader(pairs, [3, 3], 4, shuffle=False, edge_label=torch.arange(10) % 3)  # class labels
