"""The two OGB ranking protocols, checked against the ``ogb`` package's own ``Evaluator`` on
the same arrays: pooled negatives (ogbl-collab/ddi Hits@K) and per-edge negatives
(ogbl-citation2 MRR and Hits@K), in one process and combined exactly over 2 gloo ranks."""
from __future__ import annotations

import datetime
import faulthandler
import importlib.util
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphtrainer.launch.environment import free_port
from graphtrainer.evaluation.ranking import (LinkScores, per_edge_hits_at_k, per_edge_mrr, pooled_hits_at_k,
                                  ranking_metrics)


def ogb_evaluator(name: str):
    """``ogb.linkproppred.Evaluator(name)`` loaded from its file, not through ``import ogb``:
    the package's ``__init__`` starts a thread asking PyPI for a newer version (network).
    The evaluator itself reads only the ``master.csv`` bundled beside it."""
    spec = importlib.util.find_spec("ogb")  # locates the package without running its __init__
    if spec is None:
        pytest.skip("ogb is not installed (pip install ogb)")
    path = Path(spec.submodule_search_locations[0]) / "linkproppred" / "evaluate.py"
    module_spec = importlib.util.spec_from_file_location("_ogb_link_evaluate", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.Evaluator(name)


def _scores(n: int, k: int, seed: int) -> tuple:
    """Scores on a coarse grid, so ties between a positive and its negatives occur."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 12, (n,), generator=gen).float() / 4 + 0.5
    neg = torch.randint(0, 12, (n, k), generator=gen).float() / 4
    return pos, neg


def _ogb_pooled(pos: torch.Tensor, neg: torch.Tensor, k: int) -> float:
    ev = ogb_evaluator("ogbl-collab")  # Hits@50 by name; K is the only thing that differs
    ev.K = k
    return ev.eval({"y_pred_pos": pos, "y_pred_neg": neg.reshape(-1)})[f"hits@{k}"]


def _ogb_per_edge(pos: torch.Tensor, neg: torch.Tensor) -> dict:
    out = ogb_evaluator("ogbl-citation2").eval({"y_pred_pos": pos, "y_pred_neg": neg})
    return {name: float(values.mean()) for name, values in out.items()}


def test_ogb_evaluators_by_name_need_no_download():
    assert ogb_evaluator("ogbl-collab").K == 50 and ogb_evaluator("ogbl-ddi").K == 20
    assert ogb_evaluator("ogbl-citation2").eval_metric == "mrr"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_protocols_equal_ogbs_evaluators(seed):
    pos, neg = _scores(300, 20, seed)
    ours = ranking_metrics(pos, neg, hits=(1, 3, 10, 20, 50))
    for k in (1, 3, 10, 20, 50):
        assert pooled_hits_at_k(pos, neg, k) == pytest.approx(_ogb_pooled(pos, neg, k), abs=1e-12)
        assert ours[f"pooled_hits@{k}"] == pooled_hits_at_k(pos, neg, k)
    ddi = ogb_evaluator("ogbl-ddi").eval({"y_pred_pos": pos, "y_pred_neg": neg.reshape(-1)})["hits@20"]
    assert ours["pooled_hits@20"] == pytest.approx(ddi, abs=1e-12)
    citation = _ogb_per_edge(pos, neg)
    assert per_edge_mrr(pos, neg) == pytest.approx(citation["mrr_list"], rel=1e-6)
    for k in (1, 3, 10):
        assert per_edge_hits_at_k(pos, neg, k) == pytest.approx(citation[f"hits@{k}_list"], rel=1e-6)  # ogb: float32 mean
        assert ours[f"per_edge_hits@{k}"] == per_edge_hits_at_k(pos, neg, k)
    # The protocols differ: 6000 pooled negatives make the pooled threshold far higher.
    assert ours["pooled_hits@20"] < ours["per_edge_hits@10"]


def test_fewer_negatives_than_k_is_every_positive_a_hit_as_in_ogb():
    pos, neg = _scores(3, 2, 5)
    assert pooled_hits_at_k(pos, neg, 20) == 1.0 == _ogb_pooled(pos, neg, 20)
    scores = LinkScores(2, hits=(20,))
    scores.add(pos, neg)
    assert scores.compute()["pooled_hits@20"] == 1.0


def _rank(rank: int, world: int, port: int, shares: list, out: str) -> None:
    from graphtrainer.evaluation.binned_auroc import BinnedAUROC

    faulthandler.dump_traceback_later(120, exit=True)  # a hung rank prints where, and ends the test
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        pos, neg = _scores(sum(shares), 4, 11)
        start = sum(shares[:rank])
        scores = LinkScores(4, hits=(1, 3, 10, 20))
        for lo in range(start, start + shares[rank], 5):  # batches of 5 edges, the last smaller
            hi = min(lo + 5, start + shares[rank])
            scores.add(pos[lo:hi], neg[lo:hi].reshape(-1))
        result = scores.compute("val_")
        binned = BinnedAUROC(bins=14, low=0.0, high=3.5, sigmoid=False)  # one bin per score value
        binned.update(pos[start:start + shares[rank]], neg[start:start + shares[rank]])
        result.update({f"binned_{k}": v for k, v in binned.compute().items()})
        if rank == 0:
            torch.save(result, out)
        dist.barrier()  # both ranks end their collectives before either leaves
    finally:
        faulthandler.cancel_dump_traceback_later()
    # No destroy_process_group, as graphtrainer's ranks never call it (the process just ends): in two
    # CI runs a rank hung 2 minutes inside it, past the barrier, while its peer was leaving.


@pytest.mark.slow  # two spawned interpreters importing graphtrainer
@pytest.mark.timeout(240)
def test_two_ranks_combine_exactly_to_ogbs_values_on_all_edges(tmp_path):
    shares = [23, 3]  # uneven; rank 1 holds fewer negatives (12) than the pooled K=20
    out = str(tmp_path / "metrics.pt")
    mp.start_processes(_rank, args=(2, free_port(), shares, out), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out)
    pos, neg = _scores(sum(shares), 4, 11)
    citation = _ogb_per_edge(pos, neg)
    assert got["val_edges"] == 26
    assert got["val_mrr"] == pytest.approx(citation["mrr_list"], rel=1e-6)
    for k in (1, 3, 10):
        assert got[f"val_per_edge_hits@{k}"] == pytest.approx(citation[f"hits@{k}_list"], rel=1e-6)  # ogb: float32 mean
    for k in (1, 3, 10, 20):
        assert got[f"val_pooled_hits@{k}"] == pytest.approx(_ogb_pooled(pos, neg, k), abs=1e-12)
    single = ranking_metrics(pos, neg, hits=(20,))
    assert got["val_auc"] == pytest.approx(single["auc"], abs=1e-12)
    assert got["val_ap"] == pytest.approx(single["ap"], abs=1e-12)
    assert got["binned_auc"] == pytest.approx(single["auc"], abs=1e-12)  # histograms summed over ranks
    assert got["binned_ap"] == pytest.approx(single["ap"], abs=1e-12)


def test_binned_auroc_equals_sklearn_when_bins_separate_the_scores_and_stays_within_its_bound():
    from graphtrainer.evaluation.binned_auroc import BinnedAUROC

    pos, neg = _scores(300, 20, 3)  # values k/4 in [0, 3.25]: one bin each with 14 bins over [0, 3.5)
    binned = BinnedAUROC(bins=14, low=0.0, high=3.5, sigmoid=False)
    for lo in range(0, 300, 64):  # streamed in batches
        binned.update(pos[lo:lo + 64], neg[lo:lo + 64])
    got, exact = binned.compute(), ranking_metrics(pos, neg)
    assert got["auc"] == pytest.approx(exact["auc"], abs=1e-12) and got["ap"] == pytest.approx(exact["ap"], abs=1e-12)
    # Continuous logits: the binned value is within the bound it reports, which is small.
    gen = torch.Generator().manual_seed(4)
    pos, neg = torch.randn(5000, generator=gen) + 1, torch.randn(50000, generator=gen)
    binned = BinnedAUROC(bins=10_000)
    binned.update(pos, neg)
    got, exact = binned.compute(), ranking_metrics(pos, neg)
    assert abs(got["auc"] - exact["auc"]) <= binned.auc_error_bound < 1e-3
    assert got["ap"] == pytest.approx(exact["ap"], abs=2e-3)
