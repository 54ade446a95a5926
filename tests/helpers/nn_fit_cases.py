"""The four task shapes fitted with torch blocks, shared by the CPU comparison with DGL blocks
(tests/integration/test_nn_fit.py) and the GPU runs (tests/helpers/dgl_gpu_script.py)."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Set, Tuple

import torch

from graphtrainer.callbacks import Callback

from hetero_tasks import HeteroLinkTask, HeteroTask, make_hetero
from link_tasks import GraphClsTask, LinkTask, numbered_minigc, rand_link_graph
from tasks import SageTask, make_graph


class GraphKinds(Callback):
    """Each rank writes the class names and devices of the graphs its training batches held."""

    def __init__(self, out_dir: str):
        self.out_dir, self.kinds, self.devices = out_dir, set(), set()

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        def walk(x):
            if isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
            elif hasattr(x, "num_edges"):
                self.kinds.add(type(x).__name__)
                self.devices.add(str(x.device))
        walk(batch)

    def on_train_epoch_end(self, trainer, task):
        with open(os.path.join(self.out_dir, f"kinds_r{trainer.rank}.json"), "w") as fh:
            json.dump({"kinds": sorted(self.kinds), "devices": sorted(self.devices),
                       "params": sorted({str(p.device) for p in task.module.parameters()})}, fh)


def read_kinds(out_dir: Any, world: int) -> list:
    return [json.loads(open(os.path.join(out_dir, f"kinds_r{r}.json")).read()) for r in range(world)]


def _dropout(p: Any) -> Dict[str, float]:
    return {} if p is None else {"dropout": p}


# name -> (make_task(dropout), Trainer kwargs, graph classes a torch-block run's steps see).
# dropout None keeps the task's default; CPU-vs-GPU runs pass 0.0, since each device draws its
# own dropout masks.
Case = Tuple[Callable[[Any], Any], Dict[str, Any], Set[str]]
CASES: Dict[str, Case] = {
    "node": (lambda dropout: SageTask(make_graph(), fanouts=(3, 3), batch_size=16, **_dropout(dropout)), {},
             {"TorchBlock"}),
    "link": (lambda dropout: LinkTask(rand_link_graph(), torch.arange(120), torch.arange(120, 160), fanouts=[3, 3],
                                      hidden=8, batch_size=16, eval_batch_size=20, eval_negatives=5,
                                      **_dropout(dropout)), {}, {"TorchBlock"}),
    "graph": (lambda dropout: GraphClsTask(numbered_minigc(64), torch.arange(48), torch.arange(48, 64), hidden=8,
                                           batch_size=8), {}, {"TorchBlock"}),
    "hetero": (lambda dropout: HeteroTask(make_hetero(), {"paper": torch.arange(48), "word": torch.arange(16)}, 8,
                                          fanouts=(3, 3)), {"find_unused_parameters": True}, {"TorchHeteroBlock"}),
    "hetero-link": (lambda dropout: HeteroLinkTask(make_hetero(), 16), {"find_unused_parameters": True},
                    {"TorchHeteroBlock"}),
}
