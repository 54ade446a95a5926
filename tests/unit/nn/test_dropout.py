"""graphtrainer.nn.Dropout: torch's dropout, with a uniform-threshold CPU mask on the torch
releases whose CPU bernoulli_ is serial (2.5 and later)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import graphtrainer.nn as gnn
from graphtrainer.models import SAGE
from graphtrainer.nn import dropout as dropout_module  # the module (the package exports the class)


@pytest.mark.parametrize("version, serial", [("2.2.1+cu121", False), ("2.4.1", False), ("2.5.0a0+git", True),
                                             ("2.15.0+cu132", True), ("3.0.0", True)])
def test_the_mask_path_follows_the_torch_version(version, serial):
    assert dropout_module._serial_cpu_bernoulli(version) is serial


@pytest.fixture(params=[True, False], ids=["uniform-mask", "torch-mask"])
def serial(request, monkeypatch):
    monkeypatch.setattr(dropout_module, "SERIAL_CPU_BERNOULLI", request.param)
    return request.param


def test_keeps_each_element_with_probability_one_minus_p_and_scales_it(serial):
    p = 0.3
    x = torch.rand(200_000) + 1.0  # never 0, so a zero in the output is a dropped element
    out = dropout_module.dropout(x, p, training=True)
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # binomial std here: 0.001
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_keep_their_dtype_and_the_keep_probability(serial, dtype):
    p = 0.3
    x = torch.ones(200_000, dtype=dtype)
    out = dropout_module.dropout(x, p, training=True)
    assert out.dtype == dtype
    assert abs((out != 0).float().mean().item() - (1 - p)) < 0.01
    assert torch.all(out[out != 0] == torch.tensor(1 / (1 - p), dtype=dtype))


def test_gradient_is_the_scaled_mask(serial):
    x = torch.randn(5_000, 8, requires_grad=True)
    out = dropout_module.dropout(x, 0.5, training=True)
    out.sum().backward()
    expected = torch.where(out != 0, torch.full_like(x, 2.0), torch.zeros_like(x))
    torch.testing.assert_close(x.grad, expected)


def test_same_seed_same_mask_and_eval_or_zero_p_is_the_identity(serial):
    x = torch.randn(300, 16)
    torch.manual_seed(5)
    a = dropout_module.dropout(x, 0.5)
    torch.manual_seed(5)
    b = dropout_module.dropout(x, 0.5)
    assert torch.equal(a, b)
    assert dropout_module.dropout(x, 0.5, training=False) is x
    assert dropout_module.dropout(x, 0.0) is x
    assert torch.count_nonzero(dropout_module.dropout(x, 1.0)) == 0


def test_without_a_serial_bernoulli_it_is_torchs_own_dropout(monkeypatch):
    monkeypatch.setattr(dropout_module, "SERIAL_CPU_BERNOULLI", False)
    x = torch.randn(100, 10)
    torch.manual_seed(3)
    ours = dropout_module.dropout(x, 0.4)
    torch.manual_seed(3)
    assert torch.equal(ours, F.dropout(x, 0.4, True))


def test_module_is_a_torch_dropout_with_its_checks():
    layer = gnn.Dropout(0.25)
    assert isinstance(layer, torch.nn.Dropout) and repr(layer) == repr(torch.nn.Dropout(0.25))
    x = torch.randn(50, 4)
    assert layer.eval()(x) is x
    with pytest.raises(ValueError, match="inplace=True is not supported"):
        gnn.Dropout(0.5, inplace=True)
    with pytest.raises(ValueError):
        gnn.Dropout(1.5)


def test_models_use_it():
    assert isinstance(SAGE(4, 8, 2).dropout, gnn.Dropout)
