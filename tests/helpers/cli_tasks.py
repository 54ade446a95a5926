"""A task whose ``__init__`` has arguments without annotations, for the command line's tests."""
from __future__ import annotations

from tasks import RegressionTask


class UntypedTask(RegressionTask):
    """``hidden`` and ``name`` have no annotation: the CLI gives them their defaults' types."""

    def __init__(self, n=32, hidden=16, name="run", lr=0.1):  # noqa: ANN001 (untyped on purpose)
        super().__init__(n=n, hidden=hidden, lr=lr)
        self.name = name
