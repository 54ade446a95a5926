"""Tutorial 4's data: a DGL graph written in GraphBolt's on-disk ("built-in") dataset layout."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch


def write_ondisk_dataset(graph: Any, directory: Path, name: str = "cora") -> Path:
    """Write ``graph`` (ndata feat/label/*_mask) in GraphBolt's OnDiskDataset layout.

    ``metadata.yaml`` names the edge list, the node features and one node-classification
    task whose train/validation/test sets are ``(seed_nodes, labels)`` pairs. On first
    load GraphBolt converts the edges into a ``FusedCSCSamplingGraph`` under
    ``preprocessed/`` (and reuses it afterwards).
    """
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    data.mkdir(exist_ok=True)
    src, dst = graph.edges()
    np.save(data / "edges.npy", torch.stack([src, dst]).numpy())            # shape (2, E)
    np.save(data / "feat.npy", graph.ndata["feat"].float().numpy())
    task: Dict[str, Any] = {"name": "node_classification",
                            "num_classes": int(graph.ndata["label"].max()) + 1}
    for split, mask in (("train_set", "train_mask"), ("validation_set", "val_mask"),
                        ("test_set", "test_mask")):
        ids = graph.ndata[mask].nonzero(as_tuple=True)[0]
        np.save(data / f"{split}_ids.npy", ids.numpy())
        np.save(data / f"{split}_labels.npy", graph.ndata["label"][ids].numpy())
        task[split] = [{"data": [
            {"name": "seed_nodes", "format": "numpy", "path": f"data/{split}_ids.npy"},
            {"name": "labels", "format": "numpy", "path": f"data/{split}_labels.npy"}]}]
    metadata = {
        "dataset_name": name,
        "graph": {"nodes": [{"num": graph.num_nodes()}],
                  "edges": [{"format": "numpy", "path": "data/edges.npy"}]},
        "feature_data": [{"domain": "node", "name": "feat", "format": "numpy",
                          "in_memory": True, "path": "data/feat.npy"}],
        "tasks": [task],
    }
    (directory / "metadata.yaml").write_text(yaml.safe_dump(metadata))
    return directory
