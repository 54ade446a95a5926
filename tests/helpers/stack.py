"""Which tested set this suite runs on, and the skips that set needs (see docs/stacks.md)."""
from __future__ import annotations

import pytest

import graphtrainer  # noqa: F401  (before dgl: the compatibility layer)
import dgl  # noqa: F401,E402  (loads dgl.graphbolt, or graphtrainer's placeholder for it)
from graphtrainer._compat import graphbolt_available  # noqa: E402
from graphtrainer._compat.dgl_2_1 import torch_release  # noqa: E402

STACK = f"torch {torch_release()}, dgl {dgl.__version__}"

#: GraphBolt's C++ library exists only for the torch versions the dgl wheel was built for.
requires_graphbolt = pytest.mark.skipif(
    not graphbolt_available(),
    reason=f"newest stack ({STACK}): dgl 2.1.0 has no GraphBolt library for this torch; "
           f"GraphBolt runs on the pinned stack (requirements/tested.txt)")
