"""A lean rank: what ranks would import lazily is imported before they start (the fork
server does it too); the allocator's default costs no page faults per batch, and the
memory-for-speed setting is an explicit option (``Trainer(allocator=...)``)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from graphtrainer import Trainer
from graphtrainer.launch import forkserver
from graphtrainer.launch.lean import ALLOCATORS, RANK_MODULES, trim_after_epoch

from conftest import rank_children
from tasks import RegressionTask


class ImportProbe(RegressionTask):
    """Writes, from every rank at setup (before any model, optimizer or DDP exists), which
    of the lazily imported modules the rank already has."""

    def __init__(self, out_dir: str):
        super().__init__(validate=False, scheduler=None)
        self.out_dir = out_dir

    def setup(self, stage: str) -> None:
        have = [name for name in RANK_MODULES if name in sys.modules]
        with open(os.path.join(self.out_dir, f"r{self.rank}.txt"), "w") as fh:
            fh.write(",".join(have))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_forkserver_ranks_start_with_the_lazy_imports_done(root_dir, tmp_path):
    trainer = Trainer(num_procs=2, launcher="forkserver", max_epochs=1, progress_bar=False,
                      default_root_dir=root_dir, logger=False)
    trainer.fit(ImportProbe(str(tmp_path)))
    assert not rank_children() and forkserver.server_pid() is None
    for rank in range(2):
        # Inherited from the server, which imported them once for every rank.
        assert (tmp_path / f"r{rank}.txt").read_text().split(",") == list(RANK_MODULES)


# A "batch": a 16 MB buffer allocated, written and freed 12 times after the mode is set;
# prints the minor page faults of the last 8 (each fresh page of 4 KiB is one fault).
_FAULTS = textwrap.dedent("""
    import ctypes, resource, sys
    from graphtrainer.launch.lean import apply_allocator
    print(apply_allocator(sys.argv[1], launched=True))
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 16 << 20
    for i in range(12):
        if i == 4:
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ALLOCATORS)
def test_only_the_lean_allocator_faults_a_batch_in_afresh(mode):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt: Linux only")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("GRAPHTRAINER_MALLOC_TUNING", None)
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, env=env,
                         timeout=50, check=True).stdout.split()
    changed, faults = out[0] == "True", int(out[1])
    pages = 8 * (16 << 20) // 4096
    assert changed == (mode == "lean")
    if mode == "lean":
        assert faults >= 0.9 * pages  # every batch's pages mapped afresh
    else:
        assert faults <= 0.05 * pages  # the freed block is reused


def test_allocator_option_is_checked_and_the_old_variable_still_works(monkeypatch):
    monkeypatch.delenv("GRAPHTRAINER_MALLOC_TUNING", raising=False)
    assert Trainer(progress_bar=False, logger=False).config.allocator == "default"
    assert Trainer(allocator="lean", progress_bar=False, logger=False).config.allocator == "lean"
    with pytest.raises(ValueError, match=r"allocator='fast'.*'default', 'lean', 'glibc'"):
        Trainer(allocator="fast")
    for value, meaning in (("0", "glibc"), ("1", "lean")):
        monkeypatch.setenv("GRAPHTRAINER_MALLOC_TUNING", value)
        with pytest.warns(UserWarning, match=f"allocator='{meaning}'"):
            assert Trainer(progress_bar=False, logger=False).config.allocator == meaning
    monkeypatch.setenv("GRAPHTRAINER_MALLOC_TUNING", "yes")
    with warnings.catch_warnings(), pytest.raises(ValueError, match="use 0 .* or 1"):
        Trainer(progress_bar=False, logger=False)


@pytest.mark.parametrize("mode", ALLOCATORS)
def test_only_the_lean_allocator_trims_after_every_epoch(mode):
    # A per-epoch trim lowers no peak memory and makes every epoch refill the heap by page
    # faults: only "lean", which trades speed for memory, does it.
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc_trim: Linux only")
    assert trim_after_epoch(mode) == (mode == "lean")
