"""DistDGL faults: a damaged partition is refused before any graph server loads it (DGL's
loader would fill a cut feature file's missing rows with zeros and train on them)."""
from __future__ import annotations

import json
import time

import pytest

from conftest import rank_children
from dist_tasks import CORA
from graphtrainer import Trainer, datasets
from graphtrainer.examples.node_classification import NodeClassification
from graphtrainer.partition import partition_graph


@pytest.fixture(scope="module")
def cora_config(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora1")
    return partition_graph(datasets.load("cora"), "cora", 1, out).config


def _cut_in_half(path):
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    return size


@pytest.mark.timeout(120)
def test_a_cut_feature_file_is_refused_before_the_servers_load_it(tmp_path, cora_config):
    feat = cora_config.parent / "part0" / "node_feat.dgl"
    meta_path = cora_config.with_name("cora.meta.json")
    original, original_meta = feat.read_bytes(), meta_path.read_text()
    try:
        size = _cut_in_half(feat)
        started = time.monotonic()
        with pytest.raises(ValueError, match=rf"{feat} has {size // 2} bytes where {size} were written, so part 0 "
                                             r"is damaged: copy part 0 again .* or partition again"):
            Trainer(num_procs=2, max_epochs=1, default_root_dir=tmp_path, progress_bar=False,
                    enable_model_summary=False).fit(NodeClassification(str(cora_config), **CORA))
        print(f"cut partition refused in {time.monotonic() - started:.2f} s")
        assert not rank_children() and list(tmp_path.iterdir()) == []
        # A partition recorded before per-file sizes: its part's total size is checked.
        meta = json.loads(meta_path.read_text())
        del meta["files"]
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=r"part0 hold \d+ bytes where \d+ were written, so part 0 is damaged"):
            Trainer(num_procs=2, max_epochs=1, default_root_dir=tmp_path, progress_bar=False,
                    enable_model_summary=False).fit(NodeClassification(str(cora_config), **CORA))
    finally:
        feat.write_bytes(original)
        meta_path.write_text(original_meta)
