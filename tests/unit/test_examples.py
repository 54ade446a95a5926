"""The example tasks refuse graphs they cannot train on with one line naming the right example."""
from __future__ import annotations

import pytest

from graphtrainer.datasets import synthetic_hetero
from graphtrainer.examples.node_classification import NodeClassification


def test_node_classification_refuses_a_heterograph_and_names_the_hetero_example():
    graph = synthetic_hetero(num_papers=40, num_words=20)
    with pytest.raises(ValueError) as info:
        NodeClassification(graph)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("NodeClassification takes a homogeneous graph")
    assert "graphtrainer.examples.hetero_classification.HeteroClassification" in message
    assert "'paper'" in message and "'word'" in message
