"""Node embeddings for featureless node types, kept once in shared memory for every rank and
updated sparsely (as DGL's ``NodeEmbedding`` with ``SparseAdam``/``SparseAdagrad``).

A dense ``nn.Embedding`` under DDP is copied into every rank and all-reduced whole every step
(5M rows x 64 floats: 1.3 GB per rank and per step). A :class:`SparseEmbedding` is one table
in ``/dev/shm`` made where the task is built (forked ranks inherit the mapping, others map the
file by name) and no parameter, so DDP ignores it. Its optimizer (:class:`SparseAdam`,
:class:`SparseAdagrad`) gathers the touched rows' gradients of every rank, sums them per row in
float64 and divides by the number of ranks (DDP's mean); each rank updates the rows it owns
(``row % world_size``), then a barrier: each step equals one process on the union of the batches.

Use::

    # GraphTask.__init__ (the parent process): the table is made once, here
    self.author_emb = SparseEmbedding(g.num_nodes("author"), 64, ntype="author")
    # configure_model: HeteroSAGE(..., sparse_embeddings={"author": self.author_emb})
    # configure_optimizers: the dense optimizer plus the sparse one
    return [torch.optim.Adam(self.model.parameters(), 1e-3), SparseAdam([self.author_emb], lr=1e-2)]

The table is in the model's ``state_dict`` (``...weight``), its optimizer state in the
optimizer's: a resumed fit continues exactly. The trained rows outlive a fit
(:meth:`SparseEmbedding.reset_parameters` starts afresh). One machine only; the ranks must take
as many optimizer steps (the sparse step is a collective ``Join`` cannot shadow).
"""
from __future__ import annotations

import contextlib
import glob
import math
import os
import uuid
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import comm as gdist

#: Where the tables live (a RAM-backed file system on Linux).
SHM_DIR = "/dev/shm"


def _map(path: str, shape: Tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The file ``path`` as a shared tensor (created, zero-filled, when missing)."""
    numel = math.prod(shape)
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(*shape)


def _unlink(path: str, owner_pid: int) -> None:
    """Remove the table and its optimizer state files (``path.*``), in the process that made it."""
    if os.getpid() != owner_pid:  # a forked rank exiting: the files are not its to remove
        return
    for name in [path] + glob.glob(glob.escape(path) + ".*"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


class SparseEmbedding(nn.Module):
    """A ``[num_rows, dim]`` embedding table in shared memory (see the module docstring).

    Args:
        num_rows: rows (at least the node type's node count).
        dim: embedding size.
        ntype: the node type it embeds (a graph with more nodes of it is refused early).
        init_std: rows start from ``N(0, init_std)`` drawn with ``seed``, for any number of ranks.

    Build it where the task is built, never in ``configure_model`` (which runs in each rank).
    ``forward(ids)`` gives the rows, recorded in training for the sparse optimizer.
    """

    def __init__(self, num_rows: int, dim: int, ntype: Optional[str] = None, init_std: float = 1.0,
                 seed: int = 0):
        super().__init__()
        if num_rows < 1 or dim < 1:
            raise ValueError(f"SparseEmbedding({num_rows}, {dim}): rows and dim must be positive")
        self.num_rows, self.dim, self.ntype = int(num_rows), int(dim), ntype
        self.init_std, self.seed = float(init_std), int(seed)
        self.path = os.path.join(SHM_DIR, f"graphtrainer-emb-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self._owner = weakref.finalize(self, _unlink, self.path, os.getpid())  # the maker removes the file
        self._table = _map(self.path, (self.num_rows, self.dim))
        self._trace: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._optimizer: Any = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fresh rows from ``N(0, init_std)`` with the embedding's seed."""
        gen = torch.Generator().manual_seed(self.seed)
        self._table.normal_(0.0, self.init_std, generator=gen)

    # Pickled (spawn, forkserver): the path travels and the rank maps the same file.
    def __getstate__(self) -> Dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_table", "_owner", "_optimizer", "_trace")}
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table = _map(self.path, (self.num_rows, self.dim))
        self._owner, self._optimizer, self._trace = None, None, []

    @property
    def weight(self) -> torch.Tensor:
        """The whole table (shared; read it, do not write it while ranks train)."""
        return self._table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self._table[ids.long().cpu()]  # the table is in host memory; rows go to ids' device
        if self.training and torch.is_grad_enabled():
            if self._optimizer is None:
                raise RuntimeError(
                    f"SparseEmbedding{self._name()} is trained without a sparse optimizer: return "
                    "graphtrainer.nn.sparse_embedding.SparseAdam([emb], lr) (or SparseAdagrad) from "
                    "configure_optimizers beside the dense one. A torch.optim optimizer cannot update it: "
                    "it would need a dense gradient of every row, all-reduced every step")
            rows.requires_grad_(True)
            self._trace.append((ids.long().cpu().reshape(-1), rows))
        return rows.to(ids.device)

    def _name(self) -> str:
        return f" ({self.ntype!r})" if self.ntype else ""

    def take_gradients(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """This rank's ``(row ids [m], gradients [m, dim])`` since the last step; clears them."""
        ids = [i for i, _ in self._trace]
        grads = [r.grad if r.grad is not None else torch.zeros_like(r) for _, r in self._trace]
        self._trace = []
        if not ids:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, self.dim)
        return torch.cat(ids), torch.cat(grads).reshape(-1, self.dim).float()

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = self._table.clone()

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
            return
        value = state_dict[key]
        if tuple(value.shape) != (self.num_rows, self.dim):
            error_msgs.append(f"{key}: checkpoint shape {tuple(value.shape)}, table {(self.num_rows, self.dim)}")
            return
        # Every rank writes the same values: whichever rank reads a row sees the loaded one.
        self._table.copy_(value)

    def extra_repr(self) -> str:
        return f"{self.num_rows}, {self.dim}, ntype={self.ntype!r}, shared={self.path}"


def check_sparse_embeddings(task: Any) -> None:
    """Refuse, before any rank starts, a :class:`SparseEmbedding` of the task with fewer rows
    than its node type has nodes in ``task.graph``."""
    graph = getattr(task, "graph", None)
    ntypes = getattr(graph, "ntypes", ())
    for name, emb in _task_tables(task):
        if emb.ntype is None or emb.ntype not in ntypes:
            continue
        count = graph.num_nodes(emb.ntype)
        if emb.num_rows < count:
            raise ValueError(f"{type(task).__name__}.{name}: SparseEmbedding has {emb.num_rows} rows but node "
                             f"type {emb.ntype!r} has {count} nodes: build it with "
                             f"SparseEmbedding(graph.num_nodes({emb.ntype!r}), dim)")


def check_sparse_training(task: Any) -> None:
    """Refuse, before any rank starts, a fit whose model holds a task's :class:`SparseEmbedding`
    that no sparse optimizer steps, or that is given to a ``torch.optim`` optimizer.

    For such tasks ``configure_model`` and ``configure_optimizers`` run once here (torch's
    random state restored, nothing kept); where they cannot run outside a rank, the first
    training step refuses the same mistake on every rank instead.
    """
    tables = _task_tables(task)
    if not tables:
        return
    try:
        with torch.random.fork_rng(devices=[]), _dry_run():
            model = task.module if task.module is not None else task.configure_model()
            before, task.model = task.model, model
            try:
                optimizers = _optimizers_in(task.configure_optimizers())
            finally:
                task.model = before
    except Exception:  # noqa: BLE001 (the rank's own check reports it, with the rank's context)
        return
    in_model = {id(m) for m in model.modules()} if isinstance(model, nn.Module) else set()
    stepped = {id(e) for opt in optimizers if isinstance(opt, _SparseOptimizer) for e in opt.embeddings}
    for name, emb in tables:
        dense = [type(opt).__name__ for opt in optimizers if not isinstance(opt, _SparseOptimizer)
                 and any(p is emb.weight for group in opt.param_groups for p in group["params"])]
        where = f"{type(task).__name__}.{name}"
        if dense:
            raise TypeError(f"{where}: SparseEmbedding{emb._name()} is given to torch.optim.{dense[0]}, which cannot "
                            "step it (the table has no gradient of its own): give it to "
                            "graphtrainer.nn.sparse_embedding.SparseAdam([emb], lr) (or SparseAdagrad) instead, "
                            "returned from configure_optimizers beside the dense optimizer")
        if id(emb) in in_model and id(emb) not in stepped:
            raise ValueError(f"{where}: the model trains SparseEmbedding{emb._name()} but configure_optimizers "
                             "returns no sparse optimizer for it: return "
                             "graphtrainer.nn.sparse_embedding.SparseAdam([emb], lr) (or SparseAdagrad) beside the "
                             "dense optimizer. A torch.optim optimizer cannot update it: it would need a dense "
                             "gradient of every row, all-reduced every step")


def _task_tables(task: Any) -> List[Tuple[str, SparseEmbedding]]:
    """The task's tables: attributes, or values of dict attributes, named as found."""
    found = []
    for name, value in vars(task).items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, emb in items:
            if isinstance(emb, SparseEmbedding):
                found.append((name if key is None else f"{name}[{key!r}]", emb))
    return found


def _optimizers_in(value: Any) -> List[torch.optim.Optimizer]:
    """Every optimizer in what ``configure_optimizers`` returned, whatever its form."""
    if isinstance(value, torch.optim.Optimizer):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [opt for item in value for opt in _optimizers_in(item)]
    return []


_DRY = {"run": False}


@contextlib.contextmanager
def _dry_run() -> Iterator[None]:
    """Sparse optimizers made inside touch no table and bind no embedding."""
    _DRY["run"] = True
    try:
        yield
    finally:
        _DRY["run"] = False


class _SparseOptimizer(torch.optim.Optimizer):
    """Steps :class:`SparseEmbedding` tables from the rows the batches touched (module docstring).
    Constructing it and :meth:`step` must be called on all processes."""

    #: Names of the per-row state tables, each ``[num_rows, dim]``.
    STATE: Tuple[str, ...] = ()

    def __init__(self, embeddings: Sequence[SparseEmbedding], defaults: Dict[str, Any]):
        embeddings = list(embeddings)
        wrong = [type(e).__name__ for e in embeddings if not isinstance(e, SparseEmbedding)]
        if wrong or not embeddings:
            raise TypeError(f"{type(self).__name__} steps SparseEmbedding modules only, got {wrong or 'none'}: "
                            "give dense parameters to a torch.optim optimizer")
        super().__init__([e.weight for e in embeddings], defaults)
        self.embeddings = embeddings
        self.tables: List[Dict[str, torch.Tensor]] = []
        if _DRY["run"]:  # check_sparse_training: only which tables it would step
            return
        for emb in embeddings:
            emb._optimizer = self
            tables = {name: _map(f"{emb.path}.{name}", (emb.num_rows, emb.dim)) for name in self.STATE}
            tables["steps"] = _map(f"{emb.path}.steps", (emb.num_rows,))
            if gdist.get_rank() == 0:  # a new optimizer starts from zero state
                for t in tables.values():
                    t.zero_()
            self.tables.append(tables)
        gdist.barrier()

    def _combined(self, emb: SparseEmbedding) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every rank's touched rows, unique and sorted, with their float64 gradient summed
        over the rows' occurrences and divided by the number of ranks. Collective."""
        ids, grads = emb.take_gradients()
        ids, grads = gdist.all_gather_tensor(ids), gdist.all_gather_tensor(grads)
        rows, where = torch.unique(ids, return_inverse=True)
        total = torch.zeros(rows.numel(), emb.dim, dtype=torch.float64).index_add_(0, where, grads.double())
        return rows, total / gdist.get_world_size()

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: D102 (the class docstring says it)
        if closure is not None:
            with torch.enable_grad():
                closure()
        rank, world = gdist.get_rank(), gdist.get_world_size()
        lr = self.param_groups[0]["lr"]
        for emb, tables in zip(self.embeddings, self.tables):
            rows, grad = self._combined(emb)
            mine = rows % world == rank  # each row written by one rank
            if mine.any():
                self._update(emb.weight, tables, rows[mine], grad[mine], lr)
        gdist.barrier()  # nobody reads a row before its owner wrote it

    def _update(self, table: torch.Tensor, state: Dict[str, torch.Tensor], rows: torch.Tensor,
                grad: torch.Tensor, lr: float) -> None:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, Any]:
        """``lr`` and, per embedding, its state tables (copies)."""
        return {"lr": float(self.param_groups[0]["lr"]),
                "tables": [{k: v.clone() for k, v in t.items()} for t in self.tables]}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.param_groups[0]["lr"] = state_dict["lr"]
        for mine, saved in zip(self.tables, state_dict["tables"]):
            for name, table in mine.items():
                table.copy_(saved[name])  # every rank writes the same values


class SparseAdam(_SparseOptimizer):
    """Adam on the rows each step touched (as DGL's ``SparseAdam``): per-row step counts for
    the bias correction; other rows keep their moments and do not move."""

    STATE = ("exp_avg", "exp_avg_sq")

    def __init__(self, embeddings: Sequence[SparseEmbedding], lr: float = 1e-2,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(embeddings, {"lr": lr, "betas": betas, "eps": eps})

    def _update(self, table: torch.Tensor, state: Dict[str, torch.Tensor], rows: torch.Tensor,
                grad: torch.Tensor, lr: float) -> None:
        b1, b2 = self.defaults["betas"]
        steps = state["steps"][rows].double() + 1
        m = b1 * state["exp_avg"][rows].double() + (1 - b1) * grad
        v = b2 * state["exp_avg_sq"][rows].double() + (1 - b2) * grad * grad
        m_hat = m / (1 - b1 ** steps).unsqueeze(1)
        v_hat = v / (1 - b2 ** steps).unsqueeze(1)
        table[rows] = (table[rows].double() - lr * m_hat / (v_hat.sqrt() + self.defaults["eps"])).float()
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = m.float(), v.float()
        state["steps"][rows] = steps.float()


class SparseAdagrad(_SparseOptimizer):
    """Adagrad on the rows each step touched (as DGL's ``SparseAdagrad``)."""

    STATE = ("sum",)

    def __init__(self, embeddings: Sequence[SparseEmbedding], lr: float = 1e-2, eps: float = 1e-10):
        super().__init__(embeddings, {"lr": lr, "eps": eps})

    def _update(self, table: torch.Tensor, state: Dict[str, torch.Tensor], rows: torch.Tensor,
                grad: torch.Tensor, lr: float) -> None:
        total = state["sum"][rows].double() + grad * grad
        table[rows] = (table[rows].double() - lr * grad / (total.sqrt() + self.defaults["eps"])).float()
        state["sum"][rows] = total.float()
        state["steps"][rows] += 1
