"""Smoke tests of tutorials/08_graph_classification.py: MiniGC with ``--fast``, and the
bring-your-own TU reader on a small file set written here."""
from __future__ import annotations

import pytest
import torch

from tutorial_run import run_fast
from tutorial_results import check_figures


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_fast_run_on_minigc(tmp_path):
    s = run_fast("08_graph_classification.py", tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=120)
    assert s["num_procs"] == 2 and s["epochs"] == 25 and s["graphs"] == 400
    assert s["val_graphs"] == 40 and s["test_graphs"] == 40 and s["predict_rows"] == 40  # each graph once
    assert s["predict_acc"] == pytest.approx(s["test_acc"], abs=1e-6)  # predict rows in dataset order
    assert s["best_val_acc"] > 0.4, s  # 8 classes: chance is 0.125; this run reaches about 0.7
    # The figures that tutorials/results/08_graph_classification.json records, within its tolerances.
    check_figures("08_graph_classification", s)


def _write_tu(folder, name, graphs):
    """``graphs``: list of (num_nodes, undirected edge list, label); node attribute = degree."""
    a, ind, lab, attr = [], [], [], []
    base = 0
    for gi, (n, edges, label) in enumerate(graphs):
        deg = [0] * n
        for u, v in edges:
            a += [(base + u + 1, base + v + 1), (base + v + 1, base + u + 1)]
            deg[u] += 1
            deg[v] += 1
        ind += [gi + 1] * n
        attr += [[float(d), 1.0] for d in deg]
        lab.append(label)
        base += n
    (folder / f"{name}_A.txt").write_text("".join(f"{u}, {v}\n" for u, v in a))
    (folder / f"{name}_graph_indicator.txt").write_text("".join(f"{g}\n" for g in ind))
    (folder / f"{name}_graph_labels.txt").write_text("".join(f"{y}\n" for y in lab))
    (folder / f"{name}_node_attributes.txt").write_text("".join(f"{x}, {y}\n" for x, y in attr))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_fast_run_on_a_tu_dataset_written_here(tmp_path):
    # 60 graphs: paths (label 1) and stars (label 2) of 5 to 9 nodes.
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(60):
        n = 5 + int(torch.randint(0, 5, (1,), generator=gen))
        if i % 2:
            graphs.append((n, [(k, k + 1) for k in range(n - 1)], 1))
        else:
            graphs.append((n, [(0, k) for k in range(1, n)], 2))
    folder = tmp_path / "tu"
    folder.mkdir()
    _write_tu(folder, "TOY", graphs)
    s = run_fast("08_graph_classification.py", tmp_path / "out", "--tu-folder", str(folder), "--tu-name", "TOY",
                 "--root-dir", str(tmp_path / "runs"), timeout=120)
    assert s["dataset"] == "TOY" and s["graphs"] == 60
    assert s["val_graphs"] == 6 and s["test_graphs"] == 6 and s["predict_rows"] == 6
    assert s["predict_acc"] == pytest.approx(s["test_acc"], abs=1e-6)
