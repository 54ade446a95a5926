"""A plain-torch task for the GPU path (no DGL): records on every rank where its batches
and parameters live and which backend the group uses."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from graphtrainer import GraphTask
from graphtrainer import comm as gdist
from graphtrainer.data.sharding import shard_ids


class TensorBatches:
    """``(x, y)`` CPU batches of this rank's share of the rows (the trainer moves them)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = True):
        self.x, self.y, self.batch_size, self.shuffle = x, y, batch_size, shuffle
        self.epoch, self.even = 0, "pad"

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def for_evaluation(self) -> "TensorBatches":
        self.shuffle, self.even = False, "none"
        return self

    def _share(self) -> torch.Tensor:
        return shard_ids(torch.arange(self.x.shape[0]), gdist.get_rank(), gdist.get_world_size(),
                         epoch=self.epoch, shuffle=self.shuffle, even=self.even)

    def __len__(self) -> int:
        return math.ceil(self._share().numel() / self.batch_size)

    def __iter__(self):
        share = self._share()
        for i in range(0, share.numel(), self.batch_size):
            idx = share[i:i + self.batch_size]
            yield self.x[idx], self.y[idx]


class DeviceTask(GraphTask):
    def __init__(self, out_dir: str, n: int = 96, d: int = 6):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=gen)
        self.y = torch.tanh(self.x @ torch.randn(d, 1, generator=gen))
        self.out_dir = out_dir
        self.seen: Dict[str, List[str]] = {"batch": [], "param": []}

    def configure_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.x.shape[1], 16), nn.ReLU(), nn.Linear(16, 1))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return TensorBatches(self.x, self.y, 8)

    def val_dataloader(self) -> Any:
        return TensorBatches(self.x[:40], self.y[:40], 16, shuffle=False)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen["batch"].append(str(x.device))
        self.seen["param"].append(str(next(self.module.parameters()).device))
        loss = F.mse_loss(self.model(x), y)
        self.log("train_loss", loss, batch_size=x.shape[0])
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.model(x), y), batch_size=x.shape[0])

    def on_fit_end(self) -> None:
        import torch.distributed as dist

        record = {
            "rank": self.rank, "world_size": self.world_size, "task_device": str(self.device),
            "batch_devices": sorted(set(self.seen["batch"])), "param_devices": sorted(set(self.seen["param"])),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "current_device": torch.cuda.current_device() if self.device.type == "cuda" else None,
            "params": [p.detach().cpu().flatten().tolist() for p in self.module.parameters()],
            "history": self.trainer.history,
        }
        with open(os.path.join(self.out_dir, f"rank{self.rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(record, fh)
