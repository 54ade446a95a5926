"""Heterogeneous graphs: Cora as papers and words, and a synthetic one of any size.

Node types ``paper`` (``feat``, ``label``, ``*_mask``) and ``word`` (no data: models learn an
embedding); relations ``cites`` (paper-paper), ``has`` (paper-word) and ``in`` (its reverse).
"""
from __future__ import annotations

from typing import Optional

import torch

import dgl

from ._checks import PathLike, _check_frac, _check_int
from .known import load
from .synthetic import synthetic

RELATIONS = (("paper", "cites", "paper"), ("paper", "has", "word"), ("word", "in", "paper"))


def _hetero(cites: tuple, has: tuple, num_papers: int, num_words: int, papers: dgl.DGLGraph) -> dgl.DGLGraph:
    g = dgl.heterograph({RELATIONS[0]: cites, RELATIONS[1]: has, RELATIONS[2]: (has[1], has[0])},
                        num_nodes_dict={"paper": num_papers, "word": num_words})
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        g.nodes["paper"].data[key] = papers.ndata[key]
    return g


def cora_hetero(root: Optional[PathLike] = None, cache: Optional[PathLike] = None, name: str = "cora") -> dgl.DGLGraph:
    """Cora (or ``name="citeseer"``) as a heterograph of papers and words.

    Papers are Cora's nodes with features, labels, public split and citations; words are the
    1,433 bag-of-words columns, paper ``p`` ``has`` word ``w`` when ``feat[p, w] > 0`` (49,216
    pairs). Read offline like :func:`graphtrainer.datasets.load`.
    """
    papers = load(name, root=root, cache=cache)
    feat = papers.ndata["feat"]
    p, w = (feat > 0).nonzero(as_tuple=True)
    return _hetero(papers.edges(), (p, w), papers.num_nodes(), feat.shape[1], papers)


def synthetic_hetero(num_papers: int, num_words: int, avg_degree: float = 10.0, words_per_paper: int = 5,
                     feat_dim: int = 64, num_classes: int = 8, seed: int = 0,
                     homophily: float = 0.75) -> dgl.DGLGraph:
    """A reproducible, learnable heterograph of papers and words of any size.

    Papers are :func:`graphtrainer.datasets.synthetic`'s graph. Words fall into ``num_classes``
    equal blocks; each paper ``has`` ``words_per_paper`` words, each from its class's block
    with probability ``homophily``, else from all words (duplicates kept): label signal.

    1M papers, 100k words, avg_degree 10, 5 words per paper: ~6 s on 2 CPU cores.
    """
    num_papers = _check_int("num_papers", num_papers, 1)
    num_words = _check_int("num_words", num_words, num_classes)
    words_per_paper = _check_int("words_per_paper", words_per_paper, 1)
    homophily = _check_frac("homophily", homophily)
    papers = synthetic(num_papers, avg_degree, feat_dim, num_classes, seed=seed)
    gen = torch.Generator().manual_seed(int(seed) * 7 + 1)
    label = papers.ndata["label"]
    p = torch.arange(num_papers).repeat_interleave(words_per_paper)
    block = num_words // num_classes
    own = label[p] * block + torch.randint(0, block, (p.numel(),), generator=gen)
    anywhere = torch.randint(0, num_words, (p.numel(),), generator=gen)
    w = torch.where(torch.rand(p.numel(), generator=gen) < homophily, own, anywhere)
    return _hetero(papers.edges(), (p, w), num_papers, num_words, papers)
