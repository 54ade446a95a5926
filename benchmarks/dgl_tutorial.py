"""DGL's multi-GPU node-classification tutorial as its readers run it, on CPU with gloo: its 2-layer SAGE, the
graph loaded at the top (each process of ``mp.spawn`` loads its own copy), ``DataLoader(use_ddp=True)``,
``NeighborSampler([4, 4])``, batch 1024, Adam, the loss and an sklearn accuracy per step. Changed: the graph from
a DGL file, no validation or tqdm bar, ``cores // NPROCS`` threads, rank 0 writes each epoch's start to OUT.json,
``os._exit(0)`` at the end (pytorch/pytorch#190489).

    python benchmarks/dgl_tutorial.py GRAPH.bin NPROCS EPOCHS OUT.json"""
import importlib.util
import json
import os
import socket
import sys
import time

os.environ.setdefault("DGLBACKEND", "pytorch")
import torch  # noqa: E402

_graphbolt = f"graphbolt/libgraphbolt_pytorch_{torch.__version__.split('+')[0]}.so"
if not os.path.exists(os.path.join(os.path.dirname(importlib.util.find_spec("dgl").origin), _graphbolt)):
    # Newest set only: dgl 2.1 has no GraphBolt for this torch and loads only behind graphtrainer's shim.
    import graphtrainer  # noqa: F401
import dgl  # noqa: E402
import sklearn.metrics  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from dgl.nn import SAGEConv  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

HIDDEN = 128  # the tutorial's Model(num_features, 128, num_classes)


class Model(nn.Module):
    def __init__(self, in_feats: int, h_feats: int, num_classes: int):
        super().__init__()
        self.conv1 = SAGEConv(in_feats, h_feats, aggregator_type="mean")
        self.conv2 = SAGEConv(h_feats, num_classes, aggregator_type="mean")
        self.h_feats = h_feats

    def forward(self, mfgs, x):
        h_dst = x[: mfgs[0].num_dst_nodes()]  # an MFG's destination nodes come first among its sources
        h = F.relu(self.conv1(mfgs[0], (x, h_dst)))
        h_dst = h[: mfgs[1].num_dst_nodes()]
        return self.conv2(mfgs[1], (h, h_dst))


if __name__ in ("__main__", "__mp_main__"):  # the script and its spawned copies; tutorial_vs_task.py imports Model
    GRAPH_FILE, NPROCS, EPOCHS, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    (graph,), _ = dgl.load_graphs(GRAPH_FILE)
    node_features = graph.ndata["feat"]
    num_features = node_features.shape[1]
    num_classes = int(graph.ndata["label"].max()) + 1
    train_nids = torch.nonzero(graph.ndata["train_mask"], as_tuple=True)[0]
    graph.create_formats_()  # where the tutorial has it: before mp.spawn, in every process


def run(proc_id, devices, port):
    threads = max(1, len(os.sched_getaffinity(0)) // len(devices))
    torch.set_num_threads(threads)
    dgl.utils.set_num_threads(threads)
    device = torch.device("cpu")
    torch.distributed.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         world_size=len(devices), rank=proc_id)
    sampler = dgl.dataloading.NeighborSampler([4, 4])
    train_dataloader = dgl.dataloading.DataLoader(
        graph, train_nids, sampler, device=device, use_ddp=True, batch_size=1024, shuffle=True,
        drop_last=False, num_workers=0)
    model = Model(num_features, HIDDEN, num_classes).to(device)
    model = DistributedDataParallel(model, device_ids=None, output_device=None)
    opt = torch.optim.Adam(model.parameters())
    starts = []
    for epoch in range(EPOCHS):
        starts.append(time.perf_counter())
        model.train()
        for step, (input_nodes, output_nodes, mfgs) in enumerate(train_dataloader):
            inputs = mfgs[0].srcdata["feat"]
            labels = mfgs[-1].dstdata["label"]
            predictions = model(mfgs, inputs)
            loss = F.cross_entropy(predictions, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            accuracy = sklearn.metrics.accuracy_score(labels.cpu().numpy(), predictions.argmax(1).detach().cpu().numpy())
            postfix = {"loss": "%.03f" % loss.item(), "acc": "%.03f" % accuracy}  # the tutorial's tqdm postfix
    end = time.perf_counter()
    if proc_id == 0:
        with open(OUT, "w", encoding="utf-8") as fh:
            json.dump({"epoch_starts": starts, "end": end, "steps_per_epoch": step + 1, "last": postfix}, fh)
    torch.distributed.barrier()
    os._exit(0)  # see the module docstring


if __name__ == "__main__":
    with socket.socket() as s:  # the tutorial fixes port 12345; a free one lets runs follow each other
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(list(range(NPROCS)), free_port), nprocs=NPROCS)
