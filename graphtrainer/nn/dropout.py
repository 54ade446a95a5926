"""Dropout whose CPU mask costs the same on every tested torch.

From torch 2.5 the CPU ``bernoulli_`` mask no longer uses MKL's vectorised generator
(pytorch/pytorch#132395) and CPU dropout is about 9x slower (``benchmarks/arms.py stacks``: 0.5 vs
4.7 ms for 3,000 x 128, one thread; the Tolokers example trained 1.31x slower). There a CPU
mask is drawn as uniform numbers compared with ``p``: same keep probability, vectorised.
Elsewhere (CUDA, older torch) this is torch's dropout. graphtrainer's models use it; the
layers' ``feat_drop``/``attn_drop`` keep torch's, to equal ``dgl.nn``'s for the same seed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._compat.dgl_2_1 import major_minor


def _serial_cpu_bernoulli(version: str) -> bool:
    """Whether this torch draws CPU ``bernoulli_`` masks one element at a time (2.5 and later)."""
    return major_minor(version) >= (2, 5)


SERIAL_CPU_BERNOULLI = _serial_cpu_bernoulli(torch.__version__)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the uniform-threshold mask on CPU where torch's own
    mask is drawn serially (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if not SERIAL_CPU_BERNOULLI or x.device.type != "cpu" or p >= 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training)
    # Half-precision uniforms are too coarse to keep each element with probability 1 - p.
    low = x.dtype in (torch.float16, torch.bfloat16)
    uniform = torch.rand_like(x, dtype=torch.float32) if low else torch.rand_like(x)
    mask = uniform.ge_(p).to(x.dtype).mul_(1.0 / (1.0 - p))  # 0 or 1/(1-p), in place
    return x * mask


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` (same ``p``, checks and ``repr``) computed by :func:`dropout`.
    ``inplace=True`` is not supported."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        if inplace:
            raise ValueError("graphtrainer.nn.Dropout: inplace=True is not supported; use torch.nn.Dropout")
        super().__init__(p)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's own name
        return dropout(input, self.p, self.training)
