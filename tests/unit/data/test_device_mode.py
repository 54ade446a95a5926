"""Where ``Trainer(sampling=...)`` puts a loader: ``"auto"``'s memory rule without
``GRAPHTRAINER_SAMPLING_BUDGET`` (the device when the copy fits in half the device's free memory,
the measured figure, else the CPU with one line saying why), and DGL's own loaders."""
from __future__ import annotations

from types import SimpleNamespace

import psutil
import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device import mode
from graphtrainer.data.device.graph import bytes_to_copy, drop_copies
from graphtrainer.data.node_loader import NodeLoader, default_sampler

from tasks import make_graph

CPU = torch.device("cpu")


def test_a_gpus_budget_is_half_its_free_memory(monkeypatch):
    monkeypatch.delenv(mode.BUDGET_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (6_000_000_001, 80_000_000_000))
    assert mode.budget(torch.device("cuda", 1)) == (3_000_000_000, "50% of cuda:1's free memory")


@pytest.mark.parametrize("free_over_need,where", [(2.0, "device"), (1.99, "cpu")])
def test_auto_takes_the_device_when_the_copy_fits_in_its_share_of_free_memory(monkeypatch, capsys, free_over_need,
                                                                               where):
    monkeypatch.delenv(mode.BUDGET_ENV, raising=False)
    monkeypatch.setattr(mode, "auto_samples_on", lambda device: True)  # as on a GPU rank
    g = make_graph()
    drop_copies(g)
    need = bytes_to_copy(g, CPU, {"_N": ("feat", "label")}, {})
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(need * free_over_need)))
    loader = NodeLoader(g, torch.arange(20), default_sampler(g, [3]), 8)
    assert mode.place(loader, CPU, "auto", announce=True) == where == loader.sampling_mode
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[graphtrainer] sampling='auto': NodeLoader samples on "), err
    if where == "cpu":
        assert "because the graph's structure and gathered data need" in err and "50% of available RAM" in err


def test_dgls_graph_loader_is_left_alone_and_its_sampling_loader_named_by_auto(monkeypatch, capsys):
    """GraphDataLoader batches whole graphs (nothing to sample): every mode takes it as it is.
    DGL's neighbour-sampling DataLoader stays on the CPU: ``"auto"`` on a GPU rank says so."""
    g = make_graph()
    graphs = dgl.dataloading.GraphDataLoader([(g, torch.tensor(0)), (g, torch.tensor(1))], batch_size=1)
    for where in ("device", "auto", "cpu"):
        assert mode.place(graphs, CPU, where, announce=True) == "cpu"
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(mode, "auto_samples_on", lambda device: True)  # as on a GPU rank
    nodes = dgl.dataloading.DataLoader(g, torch.arange(20), default_sampler(g, [3]), batch_size=8)
    assert mode.place(nodes, CPU, "auto", announce=True) == "cpu"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sampling='auto': DGL's own DataLoader samples on the CPU because" in err, err
    assert "self.node_dataloader(ids, sampler, batch_size)" in err
    assert mode.place(nodes, CPU, "auto", announce=False) == "cpu" and capsys.readouterr().err == ""  # rank 0 only
