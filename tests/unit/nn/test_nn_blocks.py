"""Torch-only graphs built from DGL's (blocks, pair graphs, batched graphs, heterographs) and
the batch transfer that converts, pins, copies and prefetches them (its CUDA stream logic
checked here on CPU with a recorder standing in for CUDA's streams; tests/integration/test_gpu.py runs
it on a GPU)."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer.nn import TorchBlock, TorchHeteroBlock, convert_batch, to_torch_graph
from graphtrainer.nn.transfer import BatchTransfer, device_tensors, resolve_block_type

from test_nn_layers import hetero_block, random_block, random_graph
from test_nn_layers import _one_thread  # noqa: F401  (autouse fixture)


def test_block_structure_and_data_come_from_dgl():
    block = random_block(0)
    block.srcdata["feat"] = torch.randn(block.num_src_nodes(), 3)
    block.dstdata["label"] = torch.arange(block.num_dst_nodes())
    block.edata["w"] = torch.rand(block.num_edges())
    tb = to_torch_graph(block)
    indptr, indices, eids = block.adj_tensors("csc")
    assert isinstance(tb, TorchBlock) and tb.is_block
    assert torch.equal(tb.indptr, indptr) and torch.equal(tb.indices, indices) and torch.equal(tb.edge_ids, eids)
    assert (tb.num_src_nodes(), tb.num_dst_nodes(), tb.num_edges()) == \
        (block.num_src_nodes(), block.num_dst_nodes(), block.num_edges())
    assert torch.equal(tb.in_degrees(), block.in_degrees())
    assert torch.equal(tb.srcdata["feat"], block.srcdata["feat"]) and torch.equal(tb.edata["w"], block.edata["w"])
    assert torch.equal(tb.srcdata[dgl.NID], block.srcdata[dgl.NID])
    assert bool((tb.in_degrees()[:3] == 0).all())  # the seeds without in-edges are kept


def test_pair_graph_edges_and_node_data_match_dgl():
    pair = dgl.graph((torch.tensor([4, 0, 2, 2]), torch.tensor([1, 3, 0, 1])), num_nodes=5)
    pair.ndata[dgl.NID] = torch.tensor([10, 11, 12, 13, 14])
    tp = to_torch_graph(pair)
    src, dst = tp.edges()
    assert torch.equal(src, pair.edges()[0]) and torch.equal(dst, pair.edges()[1])
    assert not tp.is_block and tp.ndata is tp.srcdata is tp.dstdata
    assert torch.equal(tp.ndata[dgl.NID], pair.ndata[dgl.NID]) and tp.num_edges() == 4


def test_batched_graph_keeps_its_per_graph_node_counts():
    graphs = [random_graph(s, n=4 + s, e=6) for s in range(3)]
    batched = dgl.batch(graphs)
    tg = to_torch_graph(batched)
    assert tg.batch_size == 3 and torch.equal(tg.batch_num_nodes(), batched.batch_num_nodes())


def test_hetero_block_holds_one_structure_per_relation_and_counts_per_type():
    g, block = hetero_block()
    block.srcnodes["paper"].data["feat"] = torch.randn(block.num_src_nodes("paper"), 5)
    th = to_torch_graph(block)
    assert isinstance(th, TorchHeteroBlock) and th.canonical_etypes == block.canonical_etypes
    for nt in block.srctypes:
        assert th.num_src_nodes(nt) == block.num_src_nodes(nt)
        assert torch.equal(th.srcdata[dgl.NID][nt], block.srcnodes[nt].data[dgl.NID])
    for et in block.canonical_etypes:
        assert torch.equal(th[et].indices, block.adj_tensors("csc", etype=et)[1])
        assert th.num_edges(et) == block.num_edges(et)
    assert set(th.srcdata["feat"]) == {"paper"}


def test_to_and_convert_batch_keep_everything_else():
    block = random_block(1)
    block.srcdata["feat"] = torch.randn(block.num_src_nodes(), 2)
    seeds = torch.arange(4)
    batch = convert_batch((seeds, seeds, [block]))
    assert batch[0] is seeds and isinstance(batch[2][0], TorchBlock)
    moved = batch[2][0].to("cpu", non_blocking=True)
    assert moved.device == torch.device("cpu") and torch.equal(moved.srcdata["feat"], block.srcdata["feat"])
    assert set(moved.tensors()) >= {"indptr", "indices", "edge_ids", "srcdata.feat"}


def test_a_dgl_layer_fed_a_torch_block_names_both_fixes():
    import dgl.nn as dglnn

    block = to_torch_graph(random_block(2))
    with pytest.raises(AttributeError, match="graphtrainer.nn layers.*DGL's CUDA build.*block_type='dgl'"):
        dglnn.SAGEConv(3, 3, "mean")(block, torch.randn(block.num_src_nodes(), 3))


def test_block_type_choice():
    cpu = torch.device("cpu")
    assert resolve_block_type("auto", cpu) == "dgl" and resolve_block_type("torch", cpu) == "torch"
    with pytest.raises(ValueError, match="block_type='fast'"):
        resolve_block_type("fast", cpu)


class _Event:
    def __init__(self, log):
        self.log = log

    def record(self, stream):
        self.log.append(("record_event", id(self)))

    def synchronize(self):
        self.log.append(("synchronize", id(self)))


class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, id(event)))


class RecordingStreams:
    """CUDA's stream operations, recorded in order (the CPU stand-in for a GPU)."""

    def __init__(self):
        self.log = []
        self.main = _Stream(self.log, "main")

    def new_side_stream(self):
        return _Stream(self.log, "side")

    def current(self):
        return self.main

    def use(self, stream):
        import contextlib

        self.log.append(("use", stream.name))
        return contextlib.nullcontext()

    def new_event(self):
        return _Event(self.log)


class RecordingTransfer(BatchTransfer):
    """Pinning and copying recorded (page-locked memory needs CUDA)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pinned, self.copied = [], []

    def pin(self, batch):
        self.pinned.append(batch)
        return batch

    def copy(self, batch, device):
        self.copied.append(batch)
        self.streams.log.append(("copy", int(batch[1][0])))
        return batch


def _loader(n):
    out = []
    for i in range(n):
        block = random_block(i)
        block.srcdata["feat"] = torch.full((block.num_src_nodes(), 2), float(i))
        out.append((block.srcdata[dgl.NID], torch.tensor([i]), [block]))
    return out


def test_prefetch_starts_the_next_copy_before_yielding_and_waits_on_each_batch_event(monkeypatch):
    streams = RecordingStreams()
    recorded = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append(s.name), raising=False)
    hook_calls = []
    transfer = RecordingTransfer(torch.device("cpu"), "torch", lambda b, d: hook_calls.append(b) or b,
                                 streams=streams)
    loader = _loader(3)
    seen = []
    for item in transfer.batches(loader):
        seen.append(transfer.to_device(item))
        streams.log.append(("step", len(seen) - 1))  # the step's kernels would be enqueued here
    assert not hook_calls  # the default hook's work is done here: pin, copy, wait
    assert transfer.converted == 3 and len(transfer.pinned) == 3
    for i, batch in enumerate(seen):  # the batch returned is the converted, copied one, in order
        assert isinstance(batch[2][0], TorchBlock) and int(batch[1][0]) == i
        assert batch is transfer.copied[i]
        assert float(batch[2][0].srcdata["feat"][0, 0]) == i
    log = streams.log
    # Batch i+1's copy is enqueued before step i runs; each copy runs on the side stream
    # after it waited for the compute stream.
    for i in range(2):
        assert log.index(("copy", i + 1)) < log.index(("step", i))
    copies = [k for k, e in enumerate(log) if e[0] == "copy"]
    for k in copies:
        assert log[k - 1] == ("use", "side") and log[k - 2] == ("wait_stream", "side", "main")
    # The compute stream waits on each batch's own event before its step, not on the whole side stream.
    events = [e[1] for e in log if e[0] == "record_event"]
    waits = [e[2] for e in log if e[0] == "wait_event"]
    assert waits == events and len(events) == 3
    for i in range(3):
        assert log.index(("wait_event", "main", events[i])) < log.index(("step", i))
    # Every tensor of every batch is marked as used by the compute stream.
    expected = sum(len(list(device_tensors(b))) for b in seen)
    assert expected > 3 * 4 and recorded == ["main"] * expected


def test_without_streams_or_with_a_user_hook_batches_are_converted_then_handed_to_the_hook():
    calls = []
    user = BatchTransfer(torch.device("cpu"), "torch", lambda b, d: calls.append((b, d)) or b, hook_is_default=False,
                         streams=RecordingStreams())
    loader = _loader(2)
    assert user.batches(loader) is loader  # no prefetch around a user's hook
    out = [user.to_device(b) for b in loader]
    assert [isinstance(c[0][2][0], TorchBlock) for c in calls] == [True, True]
    assert out[1] is calls[1][0]
    keep = BatchTransfer(torch.device("cpu"), "auto", lambda b, d: b)
    batch = keep.to_device(loader[0])
    assert isinstance(batch[2][0], dgl.DGLGraph) and keep.converted == 0


def test_trainer_refuses_an_unknown_block_type_before_launching():
    from graphtrainer import Trainer

    with pytest.raises(ValueError, match="block_type='fast'.*'auto'.*'torch'.*'dgl'"):
        Trainer(block_type="fast", progress_bar=False)
    assert Trainer(progress_bar=False).config.block_type == "auto"


def test_batch_size_is_inferred_from_torch_graphs():
    from graphtrainer.loop.metrics import infer_batch_size

    block = random_block(3)
    pair = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3)
    batched = dgl.batch([random_graph(0, n=5, e=6), random_graph(1, n=6, e=6)])
    for batch in ((torch.arange(5), torch.arange(20), [block]), (torch.arange(3), pair, pair, [block]),
                  (batched, torch.tensor([0, 1]))):
        assert infer_batch_size(convert_batch(batch)) == infer_batch_size(batch)


def test_a_task_overriding_the_transfer_hook_gets_torch_blocks_to_move_itself(root_dir):
    from graphtrainer import Trainer
    from tasks import SageTask, make_graph

    class OwnTransfer(SageTask):
        seen: list = []

        def transfer_batch_to_device(self, batch, device):
            OwnTransfer.seen.append(type(batch[2][0]).__name__)
            return super().transfer_batch_to_device(batch, device)

    task = OwnTransfer(make_graph(), fanouts=(3, 3))
    trainer = Trainer(num_procs=1, max_epochs=1, limit_train_batches=2, limit_val_batches=1, block_type="torch",
                      progress_bar=False, logger=False, enable_model_summary=False, default_root_dir=root_dir)
    trainer.fit(task)
    assert OwnTransfer.seen == ["TorchBlock"] * 3  # 2 training batches, 1 validation batch
    assert trainer.history[0]["train_loss"] > 0
