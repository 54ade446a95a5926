"""Tasks and helpers of the DistDGL tests; also the script one simulated machine runs:

    python tests/helpers/dist_tasks.py PART_CONFIG IP_CONFIG OUT_DIR EPOCHS MACHINE [FAIL]

(fits, tests the best checkpoint, writes the result or the error as JSON to
OUT_DIR/machine<MACHINE>.json).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphtrainer import GraphTask, ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402
from graphtrainer.distdgl.graph import PartitionedGraph  # noqa: E402
from graphtrainer.distdgl.partition import to_partition_ids  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402
from link_tasks import LinkTask  # noqa: E402

#: Tutorial 1's Cora settings.
CORA = dict(fanouts=[10, 10], hidden=128, dropout=0.6, lr=0.005, weight_decay=5e-4, batch_size=32,
            eval_batch_size=512)


def save_seen(task: GraphTask, seen: list, name: str) -> None:
    """Gather what every rank trained on this epoch; rank 0 writes ``<out>/<name>_epoch<e>.pt``.
    Collective (call from ``on_train_epoch_end``)."""
    gathered = task.all_gather(torch.cat(seen) if seen else torch.empty(0, dtype=torch.int64))
    seen.clear()
    if task.rank == 0:
        torch.save(gathered, os.path.join(task.out, f"{name}_epoch{task.current_epoch}.pt"))


class SeedRecorder(NodeClassification):
    """Writes, after every training epoch, the seed nodes all ranks trained on to
    ``<out>/seeds_epoch<e>.pt``. With ``fail`` ("raise" or "kill-server"), rank
    ``fail_rank`` breaks the run at global step 3; "kill-server-then-rpc": also every rank
    calls its graph server at step 4 (a DGL barrier), and DGL's client aborts the rank (SIGABRT)
    on the closed socket, so the ranks die of the server's death."""

    def __init__(self, graph: Any, out: str, fail: str = "", fail_rank: int = 1, **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.out, self.fail, self.fail_rank = out, fail, fail_rank
        self._seen: list = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail and self.rank == self.fail_rank and self.global_step == 3:
            if self.fail == "raise":
                raise RuntimeError("trainer fault at step 3")
            if self.fail.startswith("kill-server"):
                kill_graph_servers(self.out)
        if self.fail == "kill-server-then-rpc" and self.global_step == 4:  # after step 3's allreduce: killed
            self.graph.barrier()
        self._seen.append(batch[1].clone())
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        save_seen(self, self._seen, "seeds")


class DistLinkPrediction(LinkTask):
    """The link-prediction test task on a partitioned training graph (no exclusion), with
    held-out pairs in partition numbering; writes each epoch's seed edges to
    ``<out>/edges_epoch<e>.pt``."""

    def __init__(self, part_config: str, val: Any, test: Any, out: str):
        graph = PartitionedGraph(part_config)
        super().__init__(graph, torch.arange(graph.num_edges()),
                         tuple(to_partition_ids(part_config, t) for t in val),
                         tuple(to_partition_ids(part_config, t) for t in test), lr=5e-3)
        self.out = out
        self._seen: list = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import dgl

        self._seen.append(batch[1].edata[dgl.EID].clone())
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        save_seen(self, self._seen, "edges")

class LocalPartitionProbe(Callback):
    """In each rank, at fit start: whether the training loader reads the one-partition graph
    from the machine's shared memory, and whether a full-neighbour batch and its features
    read that way equal the same batch through the ``DistGraph`` (written to ``out``)."""

    def __init__(self, out: str):
        self.out = out

    def on_fit_start(self, trainer: Any, task: GraphTask) -> None:
        import dgl

        from graphtrainer.distdgl.loader import single_partition

        loader = task.train_dataloader()
        local = single_partition(task.graph)
        path = os.path.join(self.out, f"local_r{trainer.rank}.json")
        if local is None:  # several partitions: every read goes through the DistGraph
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"loader_uses_shared_graph": loader._local_graph() is not None}, fh)
            return
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(2)
        seeds = torch.arange(0, task.graph.num_nodes(), 97)
        fast, slow = sampler.sample_blocks(local, seeds), sampler.sample_blocks(task.graph, seeds)

        def edges(blocks: list) -> list:
            out = []
            for block in blocks:
                src, dst = block.edges()
                pairs = torch.stack([block.srcdata[dgl.NID][src], block.dstdata[dgl.NID][dst]], 1)
                out.append(sorted(map(tuple, pairs.tolist())))
            return out

        feats_fast = task.graph.ndata["feat"].local_partition[fast[0]]
        order = torch.argsort(fast[0])
        result = {"loader_uses_shared_graph": loader._local_graph() is local,
                  "same_input_nodes": torch.equal(fast[0].sort().values, slow[0].sort().values),
                  "same_edges": edges(fast[2]) == edges(slow[2]),
                  "same_features": torch.equal(feats_fast[order], task.graph.ndata["feat"][fast[0][order]]),
                  "edges": sum(b.num_edges() for b in fast[2])}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(result, fh)


class PrefetchFormsProbe(Callback):
    """In each rank, at fit start: a node loader and an edge loader on the ``DistGraph`` whose
    samplers name their data per type (``{"_N": [...]}``, as DGL's samplers take it) and as a
    list; writes, per form, whether the first batch's features and labels equal the graph's
    rows (to ``out``)."""

    def __init__(self, out: str):
        self.out = out

    def on_fit_start(self, trainer: Any, task: GraphTask) -> None:
        import dgl

        graph, result = task.graph, {}
        forms = {"per_type": ({"_N": ["feat"]}, {"_N": ["label"]}), "list": (["feat"], ["label"])}
        for name, (feats, labels) in forms.items():
            sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=feats, prefetch_labels=labels)
            input_nodes, seeds, blocks = next(iter(task.node_dataloader(torch.arange(0, 2708, 37), sampler, 16,
                                                                        shuffle=False)))
            edge_sampler = dgl.dataloading.NeighborSampler([5], prefetch_node_feats=feats)
            edge_batch = next(iter(task.edge_dataloader(torch.arange(0, 10556, 97), edge_sampler, 16,
                                                        shuffle=False)))
            result[name] = {
                "feat": torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][input_nodes]),
                "label": torch.equal(blocks[-1].dstdata["label"], graph.ndata["label"][seeds]),
                "edge_feat": torch.equal(edge_batch[-1][0].srcdata["feat"], graph.ndata["feat"][edge_batch[0]])}
        with open(os.path.join(self.out, f"forms_r{trainer.rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh)


class EdgeFeatsProbe(Callback):
    """In each rank, at fit start: node and edge loaders on the ``DistGraph`` whose samplers
    name edge data ``w`` (a list, ``{"_E": [...]}``, ``{canonical etype: [...]}``); writes, per
    form and loader, whether every block's ``w`` equals the graph's rows for the block's edge
    ids (``w`` holds each edge's original id, so the check goes back to the unpartitioned
    graph through ``orig_ids``) to ``out``."""

    def __init__(self, out: str, orig_eids: torch.Tensor, pairs: Any):
        self.out, self.orig_eids, self.pairs = out, orig_eids, pairs

    def _same(self, blocks: list) -> bool:
        import dgl

        def same(block: Any) -> bool:  # a LazyFeature marker left in place is no data
            if "w" not in block.edata or not isinstance(block.edata["w"], torch.Tensor) or block.num_edges() == 0:
                return False
            eid = self.orig_eids[block.edata[dgl.EID]].to(torch.float32)
            return torch.equal(block.edata["w"], torch.stack([eid, -eid], 1))

        return all(same(block) for block in blocks)

    def on_fit_start(self, trainer: Any, task: GraphTask) -> None:
        import dgl

        result = {}
        forms = {"list": ["w"], "per_type": {"_E": ["w"]}, "canonical": {("_N", "_E", "_N"): ["w"]}}
        for name, edge_feats in forms.items():
            sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"],
                                                      prefetch_edge_feats=edge_feats)
            nodes = next(iter(task.node_dataloader(torch.arange(0, 2708, 37), sampler, 16, shuffle=False)))
            edges = next(iter(task.edge_dataloader(torch.arange(0, 10556, 97), sampler, 16, shuffle=False)))
            pairs = next(iter(task.edge_dataloader(self.pairs, sampler, 16, shuffle=False)))
            result[name] = {"node": self._same(nodes[-1]), "edge": self._same(edges[-1]),
                            "pairs": self._same(pairs[-1])}
        with open(os.path.join(self.out, f"edge_feats_r{trainer.rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh)


def kill_graph_servers(out: str) -> None:
    """SIGKILL this run's graph servers (children of the launching process) and note when."""
    import signal
    import time

    import psutil

    driver = psutil.Process(os.getppid())
    servers = [p for p in driver.children() if "graphtrainer.distdgl.servers" in " ".join(p.cmdline())]
    Path(out, "killed_at").write_text(repr(time.time()))
    for proc in servers:
        os.kill(proc.pid, signal.SIGKILL)


def run_machine(part_config: str, ip_config: str, out: str, epochs: int, machine: int, fail: str = "") -> None:
    """One machine's script: fit, test the best checkpoint, write ``<out>/machine<m>.json``
    (the result, or the error this machine raised)."""
    task = SeedRecorder(part_config, out, fail="" if fail == "alone" else fail, fail_rank=1, **CORA)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", dirpath=os.path.join(out, "checkpoints"))
    trainer = Trainer(num_procs=1, max_epochs=epochs, ip_config=ip_config, progress_bar=False,
                      default_root_dir=os.path.join(out, "runs"), callbacks=[ckpt, LocalPartitionProbe(out)],
                      hang_timeout=10 if fail == "alone" else 120,  # "alone": the other machine never starts
                      enable_model_summary=False)
    path = os.path.join(out, f"machine{machine}.json")
    try:
        trainer.fit(task)
        result = trainer.test(task, ckpt_path="best")
    except Exception as err:
        with open(path, "w") as fh:
            json.dump({"error": str(err).splitlines()[0], "type": type(err).__name__, "at": time.time()}, fh)
        raise
    with open(path, "w") as fh:
        json.dump({"rank": trainer.state.rank, "world_size": trainer.world_size, "test": result,
                   "last_epoch": trainer.history[-1]}, fh)


if __name__ == "__main__":
    run_machine(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                sys.argv[6] if len(sys.argv) > 6 else "")

