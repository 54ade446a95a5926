"""Sparse shared node embeddings (graphtrainer.nn.sparse_embedding): one table for every
rank, updated from the rows the batches touched, equal to one process and to torch's dense
optimizers where those apply, checkpointed and resumed exactly; bad input refused early."""
from __future__ import annotations

import gc
import os

import pytest
import torch

from graphtrainer import ModelCheckpoint, Trainer
from graphtrainer.launch.local import LocalLauncher
from graphtrainer.nn.sparse_embedding import SparseAdagrad, SparseAdam, SparseEmbedding, check_sparse_training

from conftest import rank_children
from hetero_tasks import make_hetero
from sparse_tasks import SparseHeteroTask

IDS = {"paper": torch.arange(64), "word": torch.arange(32)}  # 96 seeds of two types


@pytest.mark.parametrize("sparse, dense", [(SparseAdagrad, torch.optim.Adagrad), (SparseAdam, torch.optim.Adam)])
def test_one_process_equals_torchs_dense_optimizer_when_every_row_is_touched(sparse, dense):
    # Every row in every batch: per-row step counts equal the global one, so dense Adam applies.
    emb = SparseEmbedding(6, 3, seed=1)
    ref = torch.nn.Parameter(emb.weight.clone())
    opt, ref_opt = sparse([emb], lr=0.05), dense([ref], lr=0.05)
    target = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    for step in range(4):
        ids = torch.tensor([0, 1, 2, 3, 4, 5, step % 6, 2])  # repeats: gradients add up per row
        ((emb(ids) - target) ** 2).sum().backward()
        ((ref[ids] - target) ** 2).sum().backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    torch.testing.assert_close(emb.weight, ref.detach(), atol=1e-6, rtol=0)


def test_untouched_rows_do_not_move_and_state_round_trips():
    emb = SparseEmbedding(10, 2, seed=1)
    start = emb.weight.clone()
    opt = SparseAdam([emb], lr=0.1)
    emb(torch.tensor([3, 7])).sum().backward()
    opt.step()
    moved = (emb.weight != start).any(1)
    assert moved.tolist() == [i in (3, 7) for i in range(10)]
    saved_table, saved_opt = emb.state_dict(), opt.state_dict()
    emb(torch.tensor([3])).sum().backward()
    opt.step()
    emb.load_state_dict(saved_table)
    opt.load_state_dict(saved_opt)
    assert torch.equal(emb.weight, saved_table["weight"])
    assert opt.tables[0]["steps"].tolist() == [1.0 if i in (3, 7) else 0.0 for i in range(10)]


def test_bad_input_is_refused_naming_the_fix(root_dir, monkeypatch):
    started = []
    monkeypatch.setattr(LocalLauncher, "run", lambda self, *a, **k: started.append(a))
    with pytest.raises(TypeError, match="SparseEmbedding modules only.*torch.optim"):
        SparseAdam([torch.nn.Embedding(3, 2)])
    g = make_hetero()
    short = SparseHeteroTask(g, IDS, 12, rows=20)  # the graph has 32 words
    with pytest.raises(ValueError, match=r"20 rows but node type 'word' has 32 nodes: build it with "
                                         r"SparseEmbedding\(graph.num_nodes\('word'\), dim\)"):
        Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                find_unused_parameters=True).fit(short)
    assert not rank_children() and not list(root_dir.glob("version_*/checkpoints/*"))
    # A table that no sparse optimizer steps, or that a torch.optim optimizer is given: refused
    # in this process, before any rank starts; torch's random state as it was.
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match=r"SparseHeteroTask.word_emb: the model trains SparseEmbedding \('word'\) "
                                         r"but configure_optimizers returns no sparse optimizer for it: return "
                                         r"graphtrainer.nn.sparse_embedding.SparseAdam\(\[emb\], lr\)"):
        Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                find_unused_parameters=True).fit(SparseHeteroTask(g, IDS, 12, optimizer="dense-only"))
    with pytest.raises(TypeError, match=r"SparseHeteroTask.word_emb: SparseEmbedding \('word'\) is given to "
                                        r"torch.optim.Adam, which cannot step it.*SparseAdam\(\[emb\], lr\)"):
        Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                find_unused_parameters=True).fit(SparseHeteroTask(g, IDS, 12, optimizer="dense-table"))
    assert started == [] and torch.equal(torch.get_rng_state(), rng)
    good = SparseHeteroTask(g, IDS, 12, optimizer="adam")
    check_sparse_training(good)  # a sparse optimizer for the table: nothing to refuse, nothing bound
    assert good.model is None and good.word_emb._optimizer is None
    emb = SparseEmbedding(4, 2)
    emb.train()
    with pytest.raises(RuntimeError, match=r"without a sparse optimizer: return graphtrainer.nn.sparse_embedding"
                                           r".SparseAdam\(\[emb\], lr\)"):
        emb(torch.tensor([1]))


def _fit(root_dir, out, num_procs, batch_size, launcher="fork", epochs=2, ckpt_path=None, task=None,
         optimizer="adam"):
    out.mkdir(exist_ok=True)
    trainer = Trainer(num_procs=num_procs, launcher=launcher, max_epochs=epochs, seed=3, progress_bar=False,
                      default_root_dir=root_dir, logger=False, find_unused_parameters=True,
                      callbacks=[ModelCheckpoint(dirpath=str(out / "ckpt"), save_last=True)])
    task = task or SparseHeteroTask(make_hetero(), IDS, batch_size, optimizer=optimizer, record_dir=str(out))
    trainer.fit(task, ckpt_path=ckpt_path)
    return task


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_share_one_table_equal_to_one_process_and_resume_exactly(root_dir, tmp_path):
    # 64 papers : 32 words; batches of 12 (6 per rank): the hetero tests' exact setting.
    one = _fit(root_dir, tmp_path / "one", 1, 12)
    two = _fit(root_dir, tmp_path / "two", 2, 6)
    assert not rank_children()
    start = SparseEmbedding(32, 8, seed=5).weight
    assert float((one.word_emb.weight - start).abs().max()) > 1e-2  # training moved the rows
    # The parent's table is the ranks' table: both ranks saw the same one at the end.
    views = [torch.load(tmp_path / "two" / f"table_r{r}.pt") for r in (0, 1)]
    assert torch.equal(views[0], views[1]) and torch.equal(views[0], two.word_emb.weight)
    torch.testing.assert_close(two.word_emb.weight, one.word_emb.weight, atol=1e-5, rtol=0)

    # Resume: 1 epoch, then epoch 2 from last.ckpt in a fresh task on spawned ranks (which
    # map the new table by name): the table equals the straight 2-epoch run's exactly.
    half = _fit(root_dir, tmp_path / "half", 2, 6, epochs=1)
    fresh = SparseHeteroTask(make_hetero(), IDS, 6, optimizer="adam", record_dir=str(tmp_path / "half"))
    assert not torch.equal(fresh.word_emb.weight, half.word_emb.weight)
    _fit(root_dir, tmp_path / "half", 2, 6, launcher="spawn", epochs=2, task=fresh,
         ckpt_path=str(tmp_path / "half" / "ckpt" / "last.ckpt"))
    assert torch.equal(fresh.word_emb.weight, two.word_emb.weight)
    # The process that made a table removes it and its optimizer state when the task goes.
    names = tuple(os.path.basename(t.word_emb.path) for t in (one, two, half, fresh))
    assert sum(p.startswith(names) for p in os.listdir("/dev/shm")) == 4 * 4  # table, 2 moments, steps
    del one, two, half, fresh
    gc.collect()
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(names)]
