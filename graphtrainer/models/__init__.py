"""Reference GNNs: GraphSAGE for block (minibatch) training as in DGL's examples (:mod:`.sage`), a link
predictor and a graph classifier (:mod:`.heads`).

Their layers are :mod:`graphtrainer.nn`'s, so each model takes DGL's graphs and blocks or
graphtrainer's torch-only blocks (a GPU rank with DGL's CPU-only wheel gets the latter), with
the parameter names and results of the ``dgl.nn`` layers they replace."""
from .heads import GraphClassifier, LinkPredictor
from .sage import HeteroSAGE, SAGE

__all__ = ["SAGE", "HeteroSAGE", "LinkPredictor", "GraphClassifier"]
