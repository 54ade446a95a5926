"""A plain-torch sampled node-classification task (no DGL): neighbour sampling with torch ops
into graphtrainer.nn torch blocks, GraphSAGE from graphtrainer.models. Used by
tests/helpers/nn_gpu_script.py to fit on a GPU where DGL is not installed."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import torch
import torch.nn.functional as F

from graphtrainer import GraphTask, Trainer
from graphtrainer import comm as gdist
from graphtrainer.nn import TorchBlock
from graphtrainer.data.sharding import shard_ids


def random_csc(n: int, degree: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (n * degree,), generator=gen).sort().values
    src = torch.randint(0, n, (n * degree,), generator=gen)
    indptr = torch.zeros(n + 1, dtype=torch.long)
    indptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    return indptr, src


def sample_block(indptr: torch.Tensor, indices: torch.Tensor, dst_nodes: torch.Tensor, keep: float,
                 gen: torch.Generator) -> TorchBlock:
    """The in-edges of ``dst_nodes``, each kept with probability ``keep``; source nodes are the
    destinations first (as DGL's blocks), then the new neighbours."""
    starts, ends = indptr[dst_nodes], indptr[dst_nodes + 1]
    counts = ends - starts
    local_dst = torch.repeat_interleave(torch.arange(dst_nodes.numel()), counts)
    pos = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts) \
        + torch.repeat_interleave(starts, counts)
    mask = torch.rand(pos.numel(), generator=gen) < keep
    src_global, local_dst = indices[pos[mask]], local_dst[mask]
    new = src_global[~torch.isin(src_global, dst_nodes)].unique()
    src_nodes = torch.cat([dst_nodes, new])
    lookup = torch.full((int(indptr.numel()) - 1,), -1, dtype=torch.long)
    lookup[src_nodes] = torch.arange(src_nodes.numel())
    new_indptr = torch.zeros(dst_nodes.numel() + 1, dtype=torch.long)
    new_indptr[1:] = torch.bincount(local_dst, minlength=dst_nodes.numel()).cumsum(0)
    return TorchBlock(new_indptr, lookup[src_global], torch.arange(src_global.numel()), src_nodes.numel(),
                      dst_nodes.numel(), srcdata={"_ID": src_nodes}, dstdata={"_ID": dst_nodes})


class TorchSampledBatches:
    """This rank's seeds in batches of ``(input_nodes, seeds, blocks)`` (DGL's batch layout)."""

    def __init__(self, task: "TorchSageTask", ids: torch.Tensor, shuffle: bool):
        self.task, self.ids, self.shuffle, self.epoch = task, ids, shuffle, 0
        self.even = "pad" if shuffle else "none"

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _share(self) -> torch.Tensor:
        return shard_ids(self.ids, gdist.get_rank(), gdist.get_world_size(), epoch=self.epoch,
                         shuffle=self.shuffle, even=self.even)

    def __len__(self) -> int:
        return math.ceil(self._share().numel() / self.task.batch_size)

    def __iter__(self):
        t = self.task
        gen = torch.Generator().manual_seed(1000 * self.epoch + gdist.get_rank())
        share = self._share()
        for i in range(0, share.numel(), t.batch_size):
            seeds = share[i:i + t.batch_size]
            blocks: List[TorchBlock] = []
            dst = seeds
            for _ in range(t.layers):
                block = sample_block(t.indptr, t.indices, dst, 0.6, gen)
                blocks.insert(0, block)
                dst = block.srcdata["_ID"]
            blocks[0].srcdata["feat"] = t.x[blocks[0].srcdata["_ID"]]
            blocks[-1].dstdata["label"] = t.y[seeds]
            yield blocks[0].srcdata["_ID"], seeds, blocks


class TorchSageTask(GraphTask):
    def __init__(self, n: int = 400, layers: int = 2, batch_size: int = 64):
        super().__init__()
        self.indptr, self.indices = random_csc(n, 6, seed=0)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=gen)
        self.y = (self.x[:, :3]).argmax(1)
        self.layers, self.batch_size, self.n = layers, batch_size, n
        self.seen: Dict[str, List[str]] = {"devices": [], "types": []}

    def configure_model(self) -> torch.nn.Module:
        from graphtrainer.models import SAGE

        return SAGE(8, 32, 3, num_layers=self.layers, dropout=0.0)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=0.02)

    def train_dataloader(self) -> Any:
        return TorchSampledBatches(self, torch.arange(self.n * 3 // 4), shuffle=True)

    def val_dataloader(self) -> Any:
        return TorchSampledBatches(self, torch.arange(self.n * 3 // 4, self.n), shuffle=False)

    def _loss_acc(self, batch: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        _, _, blocks = batch
        self.seen["devices"].append(str(blocks[0].device))
        self.seen["types"].append(type(blocks[0]).__name__)
        logits = self.model(blocks, blocks[0].srcdata["feat"])
        labels = blocks[-1].dstdata["label"]
        return F.cross_entropy(logits, labels), (logits.argmax(1) == labels).float().mean()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, _ = self._loss_acc(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, acc = self._loss_acc(batch)
        self.log("val_loss", loss)
        self.log("val_acc", acc)

    def on_train_epoch_end(self) -> None:
        self.log("on_gpu", float(all(d.startswith("cuda") for d in self.seen["devices"])), batch_size=1)
        self.log("torch_blocks", float(all(t == "TorchBlock" for t in self.seen["types"])), batch_size=1)


def fit_plain_torch_task(out_dir: str, device: str) -> Dict[str, Any]:
    gpus = {"gpus": 1} if device.startswith("cuda") else {"num_procs": 1}
    trainer = Trainer(max_epochs=4, progress_bar=False, logger=False, default_root_dir=f"{out_dir}/runs",
                      block_type="torch", enable_model_summary=False, **gpus)
    trainer.fit(TorchSageTask())
    return {"history": trainer.history}
