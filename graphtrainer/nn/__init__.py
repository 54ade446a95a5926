"""Graph layers in plain torch for DGL's graphs and blocks or graphtrainer's torch-only blocks,
on any device torch supports (DGL's PyPI wheel is CPU-only): DGL's :class:`SAGEConv`
(mean/gcn/pool), :class:`GraphConv`, :class:`GATConv`, :class:`HeteroGraphConv`,
:class:`SumPooling`/:class:`AvgPooling`/:class:`MaxPooling` (:func:`readout`) and
:class:`EdgeScorer`; and :class:`Dropout`, with a CPU mask that stays fast on torch 2.5+.
"""
from .blocks import TorchBlock, TorchHeteroBlock, is_torch_graph
from .conv import GraphConv, SAGEConv
from .convert import convert_batch, to_torch_graph
from .dropout import Dropout
from .gat import GATConv
from .hetero import HeteroGraphConv
from .readout import AvgPooling, EdgeScorer, MaxPooling, SumPooling, edge_endpoints, readout, score_edges

__all__ = ["TorchBlock", "TorchHeteroBlock", "is_torch_graph", "to_torch_graph", "convert_batch", "SAGEConv",
           "GraphConv", "GATConv", "HeteroGraphConv", "SumPooling", "AvgPooling", "MaxPooling", "readout",
           "EdgeScorer", "edge_endpoints", "score_edges", "Dropout"]
