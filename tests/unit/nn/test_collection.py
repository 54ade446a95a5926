"""The one walk over a batch's containers (graphtrainer.nn.collection), and the batch
functions built on it keeping what they did."""
from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass

import pytest
import torch

from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.nn.collection import apply_to_leaves, leaves
from graphtrainer.task import move_to_device

Pair = namedtuple("Pair", "x y")


class Tagged(list):
    pass


@dataclass
class Box:
    t: torch.Tensor


def test_apply_rebuilds_every_container_with_its_own_type():
    nested = OrderedDict(b=[1, (2, Pair(3, "s"))], a=Tagged([4]))
    factory = defaultdict(list, k={"v": 5})
    out = apply_to_leaves([nested, factory], lambda v: v * 10, int)
    assert out == [OrderedDict(b=[10, (20, Pair(30, "s"))], a=[40]), {"k": {"v": 50}}]
    assert type(out[0]) is OrderedDict and list(out[0]) == ["b", "a"]
    assert type(out[0]["b"][1][1]) is Pair and type(out[0]["a"]) is Tagged
    assert type(out[1]) is defaultdict and out[1].default_factory is list


def test_apply_keeps_unselected_objects_and_does_not_open_dataclasses():
    box, text = Box(torch.zeros(2)), "s"
    out = apply_to_leaves({"box": box, "text": text, "t": torch.ones(1)}, lambda t: t + 1, torch.Tensor)
    assert out["box"] is box and out["text"] is text and torch.equal(out["t"], torch.tensor([2.0]))


def test_select_is_asked_before_a_container_is_opened():
    batch = ([1, 2], (3, 4))
    assert apply_to_leaves(batch, len, lambda obj: isinstance(obj, tuple) and obj != batch) == ([1, 2], 2)
    assert list(leaves(batch, (list, tuple))) == [batch]  # the whole batch is a leaf: not opened


def test_leaves_come_depth_first_in_order():
    batch = {"z": [1, (2, 3)], "a": Pair(4, {"k": 5}), "s": "text"}
    assert list(leaves(batch, int)) == [1, 2, 3, 4, 5]
    assert list(leaves(batch, lambda obj: isinstance(obj, int) and obj % 2 == 0)) == [2, 4]


def test_other_dict_subclasses_come_back_as_plain_dicts():
    class Keyed(dict):
        def __init__(self, key, **items):
            super().__init__(**items)

    out = apply_to_leaves(Keyed("k", a=1), str, int)
    assert out == {"a": "1"} and type(out) is dict


def test_a_select_that_is_not_a_type_or_predicate_is_refused():
    with pytest.raises(TypeError, match="a type, a tuple of types or a predicate"):
        apply_to_leaves([1], str, "int")


def test_move_to_device_walks_namedtuples_and_dicts():
    batch = Pair(torch.zeros(2), {"y": [torch.ones(3)], "n": 7})
    moved = move_to_device(batch, torch.device("cpu"))
    assert type(moved) is Pair and moved.y["n"] == 7 and torch.equal(moved.y["y"][0], torch.ones(3))


@pytest.mark.parametrize("batch,size", [
    (torch.zeros(5, 2), 5),
    (torch.tensor(1.0), 1),
    (((torch.zeros(4), "x"), torch.zeros(9)), 4),  # down the first items
    ({"a": torch.zeros(3), "b": torch.zeros(8)}, 3),
    ((torch.arange(10), torch.arange(6), ["blocks"]), 6),  # DGL's node batch: its seeds
    ((torch.arange(10), {"u": torch.arange(2), "i": torch.arange(3)}, ["blocks"]), 5),  # heterograph seeds
    (((), torch.zeros(2)), None),  # an empty first item tells nothing
    ([], None),
    ({}, None),
    ("text", None),
    (Box(torch.zeros(2)), None),
])
def test_infer_batch_size(batch, size):
    assert infer_batch_size(batch) == size


def test_infer_batch_size_reads_an_int_batch_size_attribute():
    class PygLike:
        batch_size = 12

    class Flag:
        batch_size = True

    assert infer_batch_size([PygLike(), torch.zeros(3)]) == 12
    assert infer_batch_size(Flag()) is None
