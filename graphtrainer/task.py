"""``GraphTask``: where the researcher's code lives. Loops and state belong to the Trainer."""
from __future__ import annotations

import inspect
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from . import comm as gdist
from .data.edge_loader import EdgeLoader
from .data.graph_loader import GraphLoader
from .data.node_loader import NodeLoader, helper_sampler
from .data.pyg_loader import PygLoader, check_batch_format, check_pyg_ready, with_batch_format
from .distdgl.graph import is_dist_graph
from .distdgl.loader import DistEdgeLoader, DistNodeLoader
from .loop.context import StepLog
from .loop.loggers import is_plain
from .loop.optim import OptimizersSpec
from .loop.stages import EVALUATION
from .nn.transfer import move_to_device
from .state import RunView


class GraphTask:
    """Model, data and steps of one training job; subclass it and override the hooks.

    Required: :meth:`training_step`, :meth:`train_dataloader`, :meth:`configure_optimizers`,
    and a model, from :meth:`configure_model` or assigned to ``self.model`` in ``__init__``.

    Hook order of ``Trainer.fit``, on every rank. For each hook below that
    :class:`~graphtrainer.callbacks.Callback` also has, the trainer's callbacks run theirs
    first, except that callbacks acting on reduced metrics (``after_reduction``: ``ModelCheckpoint``,
    ``EarlyStopping``, ``PrintMetrics``) run their ``on_train_epoch_end``
    after the task's, checkpoint-saving ones (``ModelCheckpoint``) last, so they see what it logs::

        setup("fit")
        configure_model()            # only when self.model is None; built in each rank
        configure_optimizers()       # after DDP wraps the model
        train_dataloader()
        val_dataloader()
        on_fit_start()
        on_train_start()
        for each epoch:
            on_train_epoch_start()
            for each training batch:     # inside torch's Join context (uneven inputs)
                on_train_batch_start(batch, batch_idx)   # batch already on the device
                training_step(batch, batch_idx)
                on_before_backward(loss)     # divided by accumulate_grad_batches
                # backward (DDP's gradient all-reduce)
                on_after_backward()
                # every accumulate_grad_batches batches and at the epoch's last:
                for each optimizer:
                    on_before_optimizer_step(optimizer)  # unscaled ("16-mixed"), before clipping
                # clip, optimizer steps
                for each optimizer:
                    on_before_zero_grad(optimizer)
                # zero_grad, step-interval schedulers
                on_train_batch_end(outputs, batch, batch_idx)
            # validation, every check_val_every_n_epoch epochs:
            on_validation_epoch_start()
            for each validation batch:   # under no_grad, in eval mode
                on_validation_batch_start(batch, batch_idx)
                validation_step(batch, batch_idx)
                on_validation_batch_end(outputs, batch, batch_idx)
            on_validation_epoch_end()
            on_train_epoch_end()
        on_train_end()
        on_fit_end()
        teardown("fit")

    ``validate``, ``test`` and ``predict`` run (shown for ``validate``; the others use
    ``test_*``/``predict_*`` in place of ``val_dataloader``/``validation_*``)::

        setup(stage)                 # "validate", "test" or "predict"
        configure_model()            # only when self.model is None
        val_dataloader()
        on_validation_epoch_start()
        for each batch:              # under no_grad, in eval mode
            on_validation_batch_start(batch, batch_idx)
            validation_step(batch, batch_idx)
            on_validation_batch_end(outputs, batch, batch_idx)
        on_validation_epoch_end()
        teardown(stage)

    Set by the trainer in each rank, for use in any hook: ``self.trainer`` (the rank's view
    of the run: epoch, step, metrics, options, see :class:`~graphtrainer.state.RunView`), ``self.rank``
    (also ``self.global_rank``), ``self.local_rank`` (the rank's number on its machine),
    ``self.world_size`` and ``self.device``; ``self.parameters()`` gives the model's.

    During ``fit`` (training steps and the fit hooks) ``self.model`` is the
    ``DistributedDataParallel`` wrapper: call it (not a submodule) so gradients are
    synchronised. In evaluation steps and hooks, and in ``validate``/``test``/``predict``,
    it is the plain model; :attr:`module` is always the plain model.
    """

    #: The network. Set it in ``__init__`` or return it from :meth:`configure_model`.
    model: Optional[nn.Module] = None
    #: Sparse formats of the task's graphs to build before ranks start, besides CSC (what
    #: in-neighbour sampling reads) and those of loaders and samplers held in attributes:
    #: e.g. ``("csc", "csr")`` for a ``NeighborSampler(edge_dir="out")`` made inside the
    #: ranks, or ``"all"``. Formats not built are built by DGL on first use, privately in
    #: each rank. See :mod:`graphtrainer.data.formats`.
    graph_formats: Union[str, Sequence[str], None] = None
    #: The loader helpers' default batches: ``"dgl"``, or ``"pyg"`` (PyG's ``Data``, :mod:`graphtrainer.nn.pyg`;
    #: set here, ``Trainer.fit`` checks torch-geometric and ``self.graph`` before any rank starts).
    batch_format: str = "dgl"

    def __init__(self) -> None:
        self.model = None
        self.hparams: Dict[str, Any] = {}
        self.trainer: Optional[RunView] = None
        #: This rank's number in the job (also :attr:`global_rank`), its number on its
        #: machine, and the number of ranks; set by the trainer in each rank.
        self.rank: int = 0
        self.local_rank: int = 0
        self.world_size: int = 1
        self.device: torch.device = torch.device("cpu")
        #: Where :meth:`log` writes; each rank's run hands the task its own.
        self.step_log: StepLog = StepLog(owner=self)

    # ---- what the user provides -------------------------------------------------------
    def configure_model(self) -> nn.Module:
        """Build and return the model. Called in each rank, so parameters are never shared."""
        raise NotImplementedError(
            f"{type(self).__name__} has no model: override configure_model() to return one, "
            "or assign self.model in __init__"
        )

    def configure_optimizers(self) -> OptimizersSpec:
        """An optimizer; or ``(optimizers, schedulers)``; or a dict with ``optimizer`` and
        ``lr_scheduler`` (a scheduler, or a dict with ``scheduler``, ``interval`` "epoch" or
        "step", ``frequency`` and, for ReduceLROnPlateau, ``monitor``)."""
        raise NotImplementedError(f"{type(self).__name__} must override configure_optimizers()")

    def train_dataloader(self) -> Iterable[Any]:
        """Training batches for this rank: usually :meth:`node_dataloader`, :meth:`edge_dataloader`
        (link prediction) or :meth:`graph_dataloader` (graph classification)."""
        raise NotImplementedError(f"{type(self).__name__} must override train_dataloader()")

    def val_dataloader(self) -> Optional[Iterable[Any]]:
        return None

    def test_dataloader(self) -> Optional[Iterable[Any]]:
        return None

    def predict_dataloader(self) -> Optional[Iterable[Any]]:
        return None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Return the loss tensor (or a dict with key ``"loss"``)."""
        raise NotImplementedError(f"{type(self).__name__} must override training_step(batch, batch_idx)")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return None

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must override test_step(batch, batch_idx) for Trainer.test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """One output row per seed of the batch (node, edge or graph), in the batch's order."""
        raise NotImplementedError(f"{type(self).__name__} must override predict_step(batch, batch_idx) to predict")

    def transfer_batch_to_device(self, batch: Any, device: torch.device) -> Any:
        """Move tensors and DGL graphs/blocks (anything with ``.to``) in ``batch`` to ``device``."""
        return move_to_device(batch, device)

    # ---- hooks (no-ops by default) ----------------------------------------------------
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None: ...

    # ---- services ---------------------------------------------------------------------
    @property
    def module(self) -> Optional[nn.Module]:
        """The plain model, never the DDP wrapper (use it for ``state_dict``)."""
        model = self.model
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    @property
    def global_rank(self) -> int:
        """This rank's number in the job (Lightning's name for :attr:`rank`)."""
        return self.rank

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The model's parameters (e.g. for an optimizer in :meth:`configure_optimizers`)."""
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__}.parameters(): there is no model yet; it is built "
                               "(configure_model) before configure_optimizers runs")
        return self.module.parameters(recurse=recurse)

    @property
    def current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def log(self, name: str, value: Union[torch.Tensor, float, Any], batch_size: Optional[int] = None,
            prog_bar: bool = False, reduce_fx: str = "mean", **lightning: Any) -> None:
        """Record ``value`` for this phase. Its epoch value is the exact mean over all ranks,
        weighted by ``batch_size`` (inferred from a DGL batch when omitted; 1 outside steps),
        or with ``reduce_fx="sum"`` the total over every call on every rank.

        ``value`` may be a ``torchmetrics.Metric`` held by the task (``self.val_auc =
        BinaryAUROC()`` in ``__init__``, or a submodule of the model) that the step updated
        (``self.val_auc.update(scores, labels)`` or ``self.val_auc(scores, labels)``): at the
        end of the phase its ``compute()`` over every rank's updates is the epoch value, and
        the metric is reset. ``batch_size`` and ``reduce_fx`` do not apply to it.

        Local only (no collective: safe in ``training_step``). ``sync_dist=`` changes nothing (always exact)."""
        self.step_log.log(name, value, batch_size, prog_bar, reduce_fx, type(self).__name__, self.rank, lightning)

    def log_dict(self, values: Dict[str, Union[torch.Tensor, float]], batch_size: Optional[int] = None,
                 prog_bar: bool = False, reduce_fx: str = "mean", **lightning: Any) -> None:
        for name, value in values.items():
            self.log(name, value, batch_size=batch_size, prog_bar=prog_bar, reduce_fx=reduce_fx, **lightning)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's rows concatenated in rank order. Must be called on all processes,
        outside ``training_step`` (e.g. in ``on_validation_epoch_end``)."""
        return gdist.all_gather_tensor(tensor)

    def save_hyperparameters(self, *names: str) -> None:
        """Record the caller's ``__init__`` arguments (or just ``names``) in ``self.hparams``.

        Graphs, tensors and modules are skipped: hyper-parameters are saved to YAML and
        checkpoints, which hold plain values.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is None:
            return
        args = {k: v for k, v in caller.f_locals.items() if k not in ("self", "__class__")}
        if names:
            args = {k: v for k, v in args.items() if k in names}
        self.hparams.update({k: v for k, v in args.items() if is_plain(v)})

    def node_dataloader(self, ids: Any, sampler: Any, batch_size: int, *, shuffle: bool = True,
                        drop_last: bool = False, graph: Any = None, seed: Optional[int] = None,
                        batch_format: Optional[str] = None, feat_key: Optional[str] = None,
                        label_key: Optional[str] = None, edge_key: Optional[str] = None,
                        attrs: Optional[Sequence[str]] = None,
                        **dataloader_kwargs: Any) -> Union[NodeLoader, DistNodeLoader, PygLoader]:
        """A :class:`~graphtrainer.data.node_loader.NodeLoader` over this rank's share of ``ids``.

        ``sampler`` is a DGL block sampler, or a list of fanouts for a ``NeighborSampler`` that prefetches
        ``feat`` and ``label``. ``graph`` defaults to ``self.graph``. Each epoch the ids are permuted with
        ``(seed, epoch)`` identically on every rank, then split evenly (padding with repeats, or dropping with
        ``drop_last=True``). Used for evaluation, the split is exact: every id once.

        ``ids`` are checked here, before any sampling (DGL would abort the process on an out-of-range id):
        built in ``__init__``, a bad id raises ``ValueError`` before ``fit`` launches anything; built in
        ``train_dataloader()`` (run in each rank), every rank raises it and ``fit`` raises ``RankFailedError``.

        On a ``DistGraph`` (a DistDGL run) it is a :class:`~graphtrainer.distdgl.loader.DistNodeLoader`:
        ``ids`` may be a ``DistTensor`` mask such as ``self.graph.ndata["train_mask"]`` (each machine splits
        its own partition's nodes between its ranks, reshuffled every epoch) or node ids (split as here).

        On a heterograph ``ids`` is ``{ntype: ids}``: each type is permuted and split evenly, ``batch_size``
        counts the seeds of all types, and batches hold ``{ntype: ids}`` (see ``NodeLoader``). ``dataloader_kwargs``
        go to DGL's ``DataLoader``: ``num_workers=k`` samples in ``k`` worker processes per rank with the same
        batches as ``k=0``; ``persistent_workers=True`` keeps them across epochs.

        ``batch_format="pyg"`` (default :attr:`batch_format`) yields PyG's ``Data`` in place of DGL's tuple
        (:class:`~graphtrainer.data.pyg_loader.PygLoader`; fanouts list the input layer first). ``feat_key``/
        ``label_key``/``edge_key``: the data read as ``x``, ``y``, ``edge_attr`` (default ``feat``, ``label``, edge
        ``feat``, else PyG's names) and a list of fanouts prefetches; one the graph lacks is refused. ``attrs``: the
        other node and edge data PyG batches carry under their own names (default: all, as PyG's; ``()``: none)."""
        graph, seed, sampler, fmt = self._helper_args("node_dataloader", graph, seed, sampler, batch_format,
                                                      feat_key, label_key, edge_key)
        if is_dist_graph(graph):
            if dataloader_kwargs:
                raise ValueError(f"node_dataloader on a DistGraph takes no DataLoader options "
                                 f"({sorted(dataloader_kwargs)}): it samples in the rank and on the graph servers")
            loader: Any = DistNodeLoader(graph, ids, sampler, batch_size, shuffle=shuffle, drop_last=drop_last,
                                         seed=seed)
        else:
            loader = NodeLoader(graph, ids, sampler, batch_size, shuffle=shuffle, drop_last=drop_last,
                                seed=seed, **dataloader_kwargs)
        return with_batch_format(loader, fmt, feat_key, label_key, edge_key, attrs=attrs)

    def edge_dataloader(self, edges: Any, sampler: Any, batch_size: int, *, negatives: Any = 1,
                        exclude: Optional[str] = None, reverse_eids: Any = None, shuffle: bool = True,
                        drop_last: bool = False, graph: Any = None, seed: Optional[int] = None,
                        batch_format: Optional[str] = None, feat_key: Optional[str] = None,
                        edge_key: Optional[str] = None, neg_sampling: Any = None, edge_label: Any = None,
                        attrs: Optional[Sequence[str]] = None,
                        **dataloader_kwargs: Any) -> Union[EdgeLoader, DistEdgeLoader, PygLoader]:
        """An :class:`~graphtrainer.data.edge_loader.EdgeLoader`: link-prediction batches over this rank's share of
        seed edges, split like :meth:`node_dataloader`'s ids.

        ``edges``: edge ids of the graph (or a boolean mask over edges), or node pairs, ``(src, dst)`` or a ``[2, E]``
        tensor as PyG's ``edge_label_index`` (e.g. held-out edges not in the graph). ``sampler``: a DGL block sampler
        or fanouts (``NeighborSampler`` prefetching ``feat``); DGL's ``as_edge_prediction_sampler`` wraps it.
        ``negatives``: ``k`` uniform negatives per edge, reproducible from ``(seed, epoch, edge)`` (PyG batches: a
        float ratio too), a DGL negative sampler, or ``None``. ``exclude``: ``"self"`` or ``"reverse_id"`` (with
        ``reverse_eids``) keeps the seed edges (and reverses) out of the blocks.

        Batches are DGL's ``(input_nodes, pair_graph, neg_pair_graph, blocks)``; the batch size ``self.log`` uses is
        the number of seed edges. Ids and reverse ids are checked here, before any sampling (DGL aborts on a bad id).

        On a ``DistGraph`` it is a :class:`~graphtrainer.distdgl.loader.DistEdgeLoader` (edge ids, a ``DistTensor``
        edge mask or node pairs, in partition numbering; no ``exclude``).

        On a heterograph ``edges`` is ``{etype: eids}``; pass ``exclude="reverse_types",
        reverse_etypes={etype: reverse etype}`` to keep reverses out of the blocks (see
        :class:`~graphtrainer.data.edge_loader.EdgeLoader`). ``batch_format="pyg"``: ``LinkNeighborLoader``'s
        ``Data``, ``neg_sampling="binary"`` (default) or ``"triplet"`` (or PyG's ``NegativeSampling``, or a dict of its
        fields: amount, src_weight, dst_weight), ``edge_label``: the positives' labels, one per seed edge
        (:class:`~graphtrainer.data.pyg_loader.PygLoader`; keys and ``attrs``: see node_dataloader)."""
        graph, seed, sampler, fmt = self._helper_args("edge_dataloader", graph, seed, sampler, batch_format,
                                                      feat_key, None, edge_key)
        if is_dist_graph(graph):
            if reverse_eids is not None or dataloader_kwargs:
                raise ValueError("edge_dataloader on a DistGraph takes no reverse_eids or DataLoader options")
            loader: Any = DistEdgeLoader(graph, edges, sampler, batch_size, negatives=negatives, exclude=exclude,
                                         shuffle=shuffle, drop_last=drop_last, seed=seed)
        else:
            loader = EdgeLoader(graph, edges, sampler, batch_size, negatives=negatives, exclude=exclude,
                                reverse_eids=reverse_eids, shuffle=shuffle, drop_last=drop_last, seed=seed,
                                **dataloader_kwargs)
        return with_batch_format(loader, fmt, feat_key, None, edge_key, neg_sampling, edge_label, attrs)

    def _helper_args(self, name: str, graph: Any, seed: Optional[int], sampler: Any, batch_format: Optional[str],
                     *keys: Optional[str]) -> Any:
        graph = graph if graph is not None else getattr(self, "graph", None)
        if graph is None:
            raise ValueError(f"{name} needs a graph: pass graph= or set self.graph")
        fmt = self.batch_format if batch_format is None else batch_format
        sampler = helper_sampler(graph, sampler, fmt, *keys, labels=name == "node_dataloader")
        return graph, self.trainer.seed if seed is None and self.trainer is not None else seed or 0, sampler, fmt

    def graph_dataloader(self, dataset: Any, batch_size: int, indices: Any = None, *, shuffle: bool = True,
                         drop_last: bool = False, seed: Optional[int] = None) -> GraphLoader:
        """A :class:`~graphtrainer.data.graph_loader.GraphLoader`: ``(dgl.batch(graphs), labels)``
        batches over this rank's share of the graphs ``indices`` (default: all) of
        ``dataset``, split like :meth:`node_dataloader`'s ids.

        ``dataset``: a :class:`~graphtrainer.data.graph_loader.PackedGraphs`, a ``DGLDataset`` or
        a sequence of ``(graph, label)``. Pack it once in ``__init__``
        (``self.graphs = PackedGraphs(dataset)``): the packed tensors are shared by the
        ranks (shared memory with spawn) instead of each rank packing its own copy.
        Evaluation sees every graph once; ``Trainer.predict`` returns one row per graph in
        the order of ``indices``. The batch size ``self.log`` uses is the number of graphs.
        """
        if seed is None:
            seed = self.trainer.seed if self.trainer is not None else 0
        return GraphLoader(dataset, batch_size, indices, shuffle=shuffle, drop_last=drop_last, seed=seed)


# The trainer pins, copies and prefetches torch blocks itself only for this default hook.
GraphTask.transfer_batch_to_device.graphtrainer_default = True  # type: ignore[attr-defined]


_REQUIRED = {"fit": ("training_step", "train_dataloader", "configure_optimizers"),
             **{stage.name: (f"{stage.hook}_step", stage.loader_method) for stage in EVALUATION.values()}}


def check_task(task: Any, stage: str) -> None:
    """Fail early, naming the hook, when ``task`` cannot run ``stage``."""
    if not isinstance(task, GraphTask):
        raise TypeError(f"Trainer expects a GraphTask, got {type(task).__name__}")
    if not hasattr(task, "step_log"):
        raise TypeError(f"{type(task).__name__}.__init__ must call super().__init__()")
    for hook in _REQUIRED[stage]:
        if getattr(type(task), hook) is getattr(GraphTask, hook):
            raise NotImplementedError(f"{type(task).__name__} does not override {hook}(), which "
                                      f"Trainer.{stage} needs")
    if task.module is None and type(task).configure_model is GraphTask.configure_model:
        raise NotImplementedError(f"{type(task).__name__} has no model: override configure_model() "
                                  "or assign self.model in __init__")
    if check_batch_format(task.batch_format) == "pyg":
        check_pyg_ready(getattr(task, "graph", None))
