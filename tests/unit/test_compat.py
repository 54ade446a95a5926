"""The DGL compatibility layer (graphtrainer/_compat/dgl_2_1.py): DGL 2.1 importable on a torch
it was not built for, with GraphBolt replaced by a placeholder that explains itself."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import graphtrainer  # noqa: F401
import dgl  # noqa: E402
from graphtrainer._compat import dgl_2_1  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_placeholder_is_used_exactly_when_the_wheel_lacks_this_torch():
    dgl_dir = os.path.dirname(dgl.__file__)
    shipped = dgl_2_1.graphbolt_torch_versions(dgl_dir)
    assert shipped, "the dgl wheel ships GraphBolt libraries for some torch"
    assert dgl_2_1.graphbolt_available() == (dgl_2_1.torch_release() in shipped)


def test_placeholder_names_torch_the_shipped_versions_and_the_fix():
    module = dgl_2_1.GraphBoltUnavailable(dgl_2_1.graphbolt_message(["2.1.0", "2.2.1"]))
    with pytest.raises(ImportError) as err:
        module.seed(0)
    text = str(err.value)
    assert f"torch {dgl_2_1.torch_release()}" in text
    assert "2.1.0, 2.2.1" in text and "torch==2.2.1 dgl==2.1.0" in text
    # DGL's own isinstance checks must answer False, and nothing can be built from them.
    assert not isinstance(object(), module.FusedCSCSamplingGraph)
    with pytest.raises(ImportError, match="FusedCSCSamplingGraph"):
        module.FusedCSCSamplingGraph()
    # The import system and inspect probe dunders with hasattr: those must not raise ImportError.
    assert not hasattr(module, "__path__")


def test_too_old_torch_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "1.13.1+cpu")
    with pytest.raises(ImportError, match=r"needs torch >= 2.0; this is torch 1.13.1"):
        dgl_2_1.install()


def _fake_dgl(root, version: str, shipped: str) -> None:
    """A stand-in dgl package that, like DGL 2.1, imports graphbolt eagerly and whose
    graphbolt fails to load on a torch it has no library for."""
    pkg = root / "dgl"
    (pkg / "graphbolt").mkdir(parents=True)
    (pkg / "graphbolt" / f"libgraphbolt_pytorch_{shipped}.so").write_bytes(b"")
    (pkg / "graphbolt" / "__init__.py").write_text(
        "raise FileNotFoundError('Cannot find DGL C++ graphbolt library')\n")
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        from . import graphbolt
        from . import utils
        __version__ = "{version}"
        def seed(value): pass
    """))
    (pkg / "utils.py").write_text("def get_num_threads(): return 1\ndef set_num_threads(n): pass\n")
    meta = root / f"dgl-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dgl\nVersion: {version}\n")


def _import_with_fake_dgl(tmp_path, version: str, shipped: str) -> subprocess.CompletedProcess:
    _fake_dgl(tmp_path, version, shipped)
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("always")
        import graphtrainer, dgl
        gb = sys.modules["dgl.graphbolt"]
        print("placeholder" if not graphtrainer._compat.graphbolt_available() else "real")
        try:
            gb.seed(0)
        except ImportError as err:
            print("ImportError:", err)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_dgl_whose_graphbolt_cannot_load_imports_behind_graphtrainer(tmp_path):
    out = _import_with_fake_dgl(tmp_path, "2.1.0", shipped="1.0.0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("placeholder")
    assert "only for torch 1.0.0" in out.stdout and "requirements/tested.txt" in out.stdout
    assert "tested with dgl" not in out.stderr


def test_untested_dgl_version_is_named_with_the_fix(tmp_path):
    out = _import_with_fake_dgl(tmp_path, "2.4.0", shipped="1.0.0")
    assert out.returncode == 0, out.stderr
    assert "tested with dgl 2.1.0; this is dgl 2.4.0" in out.stderr
    assert "pip install torch==2.2.1 dgl==2.1.0" in out.stderr
