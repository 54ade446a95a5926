"""DistDGL runs (issue 15): graph servers and trainer ranks started by the Trainer, real
processes over gloo and DGL's RPC, each test bounded by a timeout and checked to leave no
process, port or shared-memory segment behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import own_temp_folders, rank_children
from dist_tasks import CORA, DistLinkPrediction, EdgeFeatsProbe, LocalPartitionProbe, PrefetchFormsProbe, SeedRecorder
from graphtrainer import ModelCheckpoint, RankFailedError, Trainer, datasets
from graphtrainer.distdgl import servers
from graphtrainer.distdgl.cluster import check_options, resolve_cluster
from graphtrainer.distdgl.graph import PartitionedGraph
from graphtrainer.examples.node_classification import NodeClassification
from graphtrainer.distdgl.partition import load_orig_ids, partition_graph
from graphtrainer.launch.supervisor import FAILURE_SETTLE_S

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


def dgl_segments() -> set:
    """Shared-memory segments a DistDGL server makes for Cora: the graph and its features."""
    return {p.name for p in SHM.iterdir() if p.name.startswith(("cora", "node~", "edge~"))} if SHM.is_dir() else set()


@pytest.fixture(scope="module")
def cora():
    return datasets.load("cora")


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory, cora):
    """Cora in one partition, as ``python -m graphtrainer.cli.partition --parts 1`` writes it."""
    out = tmp_path_factory.mktemp("cora1")
    return partition_graph(cora, "cora", 1, out).config


@pytest.fixture(autouse=True)
def _nothing_left():
    """No rank, graph server, segment or temporary folder outlives a test (refused runs included)."""
    before, folders = dgl_segments(), own_temp_folders()
    yield
    assert own_temp_folders() <= folders, f"temporary folders left: {sorted(own_temp_folders() - folders)}"
    deadline = time.monotonic() + 10
    while rank_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not rank_children(), f"processes left: {[p.cmdline() for p in rank_children()]}"
    assert dgl_segments() <= before, f"shared memory left: {sorted(dgl_segments() - before)}"


def _trainer(root, epochs, **kwargs):
    kwargs.setdefault("callbacks", [])
    return Trainer(num_procs=2, max_epochs=epochs, default_root_dir=root, progress_bar=False,
                   enable_model_summary=False, hang_timeout=120, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_machine_trains_cora_to_the_floor_and_covers_each_train_id_once_per_epoch(tmp_path, cora, cora_parts):
    """1 partition, 2 trainer ranks, nothing but the partition folder: accuracy as on one
    machine, every train id once per epoch, a new order every epoch, exact evaluation."""
    task = SeedRecorder(cora_parts, str(tmp_path), **CORA)
    assert isinstance(task.graph, PartitionedGraph)  # the driver never loads the graph
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max")
    trainer = _trainer(tmp_path / "runs", 40, callbacks=[ckpt])
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    assert result["test_acc"] >= 0.78, result
    assert result["test_nodes"] == 1000 and trainer.history[-1]["val_nodes"] == 500  # each id once

    orig = load_orig_ids(cora_parts)["nodes"]
    train_ids = cora.ndata["train_mask"][orig].nonzero().squeeze(1)  # in partition numbering
    orders = []
    for epoch in range(40):
        seen = torch.load(tmp_path / f"seeds_epoch{epoch}.pt")
        assert torch.equal(torch.sort(seen).values, train_ids), f"epoch {epoch}: not each train id once"
        orders.append(seen)
    assert not torch.equal(orders[0], orders[1])  # reshuffled between epochs
    assert Path(ckpt.best_model_path).is_file() and Path(ckpt.best_model_path).parent.parent == trainer.log_dir


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(240)
def test_one_partition_is_read_from_shared_memory_and_equals_the_distgraph_reads(tmp_path, cora_parts):
    """One partition holds the whole graph under its own ids: the loaders sample it and read
    its features in the machine's shared memory; a full-neighbour batch and its features
    equal the same batch through the DistGraph."""
    task = NodeClassification(cora_parts, **CORA)
    _trainer(tmp_path / "runs", 1, callbacks=[LocalPartitionProbe(str(tmp_path))]).fit(task)
    for rank in range(2):
        probe = json.loads((tmp_path / f"local_r{rank}.json").read_text())
        assert probe["edges"] > 0
        assert probe == {"loader_uses_shared_graph": True, "same_input_nodes": True, "same_edges": True,
                         "same_features": True, "edges": probe["edges"]}


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(240)
def test_prefetch_lists_per_node_type_are_read_as_on_one_machine(tmp_path, cora_parts):
    """A sampler naming its data ``{"_N": ["feat"]}`` (DGL's per-type form) or ``["feat"]``:
    node and edge batches on the DistGraph carry those rows, as the in-memory loaders do."""
    task = NodeClassification(cora_parts, **CORA)
    _trainer(tmp_path / "runs", 1, callbacks=[PrefetchFormsProbe(str(tmp_path))]).fit(task)
    same = {"feat": True, "label": True, "edge_feat": True}
    for rank in range(2):
        assert json.loads((tmp_path / f"forms_r{rank}.json").read_text()) == {"per_type": same, "list": same}


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(240)
def test_prefetch_edge_feats_reach_every_block_as_on_one_machine(tmp_path, cora):
    """A sampler's ``prefetch_edge_feats`` (a list, per edge type, per canonical type): every
    block of node, edge and node-pair batches on the DistGraph carries the graph's edge data
    for its edge ids (DGL's DistGraph loaders leave it out without a word)."""
    graph = cora.clone()
    eid = torch.arange(graph.num_edges(), dtype=torch.float32)
    graph.edata["w"] = torch.stack([eid, -eid], 1)  # each edge's original id, checkable in the ranks
    config = partition_graph(graph, "cora", 1, tmp_path / "parts").config
    probe = EdgeFeatsProbe(str(tmp_path), load_orig_ids(config)["edges"], (torch.arange(40), torch.arange(40, 80)))
    _trainer(tmp_path / "runs", 1, callbacks=[probe]).fit(NodeClassification(str(config), **CORA))
    same = {"node": True, "edge": True, "pairs": True}
    for rank in range(2):
        result = json.loads((tmp_path / f"edge_feats_r{rank}.json").read_text())
        assert result == {"list": same, "per_type": same, "canonical": same}, result


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_predictions_come_back_in_id_order_equal_to_the_in_memory_model(tmp_path, cora, cora_parts):
    task = NodeClassification(cora_parts, **CORA)
    _trainer(tmp_path / "runs", 2).fit(task)
    dist_rows = _trainer(tmp_path / "runs", 1).predict(task)
    # The same weights on the in-memory graph, one process: K=1 keeps Cora's numbering.
    assert torch.equal(load_orig_ids(cora_parts)["nodes"], torch.arange(cora.num_nodes()))
    local = NodeClassification(cora, **CORA)
    local.model = local.configure_model()
    local.model.load_state_dict(task.module.state_dict())
    local_rows = Trainer(max_epochs=1, progress_bar=False, logger=False, enable_model_summary=False).predict(local)
    assert dist_rows.shape == (1000, 7)
    assert torch.allclose(dist_rows, local_rows, atol=1e-5), (dist_rows - local_rows).abs().max()


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(120)
def test_a_trainer_raising_ends_the_run_naming_rank_and_machine(tmp_path, cora_parts):
    task = SeedRecorder(cora_parts, str(tmp_path), fail="raise", **CORA)
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        _trainer(tmp_path / "runs", 5).fit(task)
    assert time.monotonic() - started < 60
    err = info.value
    assert err.rank == 1 and err.machine == "0 (127.0.0.1)"
    assert "rank 1 on machine 0 (127.0.0.1) failed: RuntimeError: trainer fault at step 3" in str(err)


class FailsInRank(NodeClassification):
    def configure_optimizers(self):
        raise RuntimeError("no optimizer today")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_fit_failing_before_anything_worth_keeping_leaves_no_run_folder(tmp_path, cora_parts):
    with pytest.raises(RankFailedError, match="no optimizer today"):
        _trainer(tmp_path / "runs", 2).fit(FailsInRank(cora_parts, **CORA))
    assert list((tmp_path / "runs").glob("version_*")) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_graph_server_ends_the_run_within_30_s_naming_it(tmp_path, cora_parts):
    task = SeedRecorder(cora_parts, str(tmp_path), fail="kill-server", fail_rank=0, **CORA)
    with pytest.raises(RankFailedError) as info:
        _trainer(tmp_path / "runs", 5).fit(task)
    surfaced = time.time() - float((tmp_path / "killed_at").read_text())
    print(f"server killed -> fit raised in {surfaced:.2f} s")
    assert surfaced < 30, surfaced
    err = info.value
    assert err.rank == -1 and err.error_type == "GraphServerDied"
    assert "graph server 0 on machine 0 (127.0.0.1)" in str(err) and "killed by signal SIGKILL" in str(err)
    assert "Server is waiting for connections" in err.remote_traceback  # the end of its log


def _server_death_reported_late(monkeypatch, late_s: float) -> None:
    """In this (the launching) process, a graph server's ``Popen.poll`` reports its end ``late_s``
    after it first could: the kernel reports a death a moment after the process has closed its
    files (its ranks' sockets), a moment stretched here past the watch's settling time."""
    real, held = subprocess.Popen.poll, {}

    def poll(self):
        if "graphtrainer.distdgl.servers" not in " ".join(map(str, self.args)):
            return real(self)
        if self.pid not in held:
            if real(self) is None:
                return None
            held[self.pid] = time.monotonic() + late_s
        return self.returncode if time.monotonic() >= held[self.pid] else None

    monkeypatch.setattr(subprocess.Popen, "poll", poll)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("reported_late", [False, True])
def test_a_killed_graph_server_is_named_also_when_its_ranks_die_first(tmp_path, cora_parts, monkeypatch,
                                                                        reported_late):
    """Every rank calls the killed server and DGL's client aborts it (SIGABRT): the ranks' deaths
    reach the launcher before, or as, the kernel reports the server's (``reported_late``: surely
    after the watch's settling time, within the wait for a server once a rank was killed)."""
    if reported_late:
        late_s = FAILURE_SETTLE_S + 0.5
        assert late_s < servers.EXIT_NOTICE_S
        _server_death_reported_late(monkeypatch, late_s)
    task = SeedRecorder(cora_parts, str(tmp_path), fail="kill-server-then-rpc", fail_rank=0, **CORA)
    with pytest.raises(RankFailedError) as info:
        _trainer(tmp_path / "runs", 5).fit(task)
    err = info.value
    assert err.rank == -1 and err.error_type == "GraphServerDied", str(err)
    assert "graph server 0 on machine 0 (127.0.0.1)" in str(err) and "killed by signal SIGKILL" in str(err)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_ends_servers_and_ranks(tmp_path, cora_parts, process_owner, terminal_sigint):
    """SIGINT to the whole process group (a terminal's Ctrl-C) mid-training: the script
    ends, and no rank, server or shared-memory segment is left."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests' / 'helpers')!r}]
        from dist_tasks import CORA
        from graphtrainer import Callback, Trainer
        from graphtrainer.examples.node_classification import NodeClassification

        class Announce(Callback):
            def on_train_epoch_end(self, trainer, task):
                if trainer.rank == 0 and trainer.current_epoch == 1:
                    print("TRAINING", flush=True)

        if __name__ == "__main__":
            Trainer(num_procs=2, max_epochs=10_000, progress_bar=False, default_root_dir={str(tmp_path / 'runs')!r},
                    callbacks=[Announce()]).fit(NodeClassification({str(cora_parts)!r}, **CORA))
    """))
    # process_owner: its own session (a group to signal), ended whatever the outcome
    proc = process_owner.start([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "TRAINING" in line:
            break
    assert "TRAINING" in line, "".join(lines)
    family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert any("graphtrainer.distdgl.servers" in " ".join(psutil.Process(p).cmdline()) for p in family[1:])
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert proc.returncode != 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_link_prediction_on_a_partitioned_graph_covers_each_edge_once_and_ranks_exactly(tmp_path, cora):
    """edge_dataloader on the DistGraph: every training edge once per epoch, held-out pairs
    scored exactly once, ROC-AUC near the in-memory figure (GAE's 0.91 on Cora)."""
    split = datasets.link_split(cora, seed=0)
    config = partition_graph(split.graph, "cora", 1, tmp_path / "parts").config
    task = DistLinkPrediction(str(config), split.val, split.test, str(tmp_path))
    trainer = _trainer(tmp_path / "runs", 6)
    trainer.fit(task)
    result = trainer.test(task)
    print("link prediction on a DistGraph:", result)
    assert result["test_auc"] >= 0.85 and result["test_edges"] == split.test[0].numel(), result
    for epoch in (0, 5):
        seen = torch.load(tmp_path / f"edges_epoch{epoch}.pt")
        # 2 ranks, padded to an even split: every edge, and at most one repeated.
        assert torch.equal(torch.unique(seen), torch.arange(split.graph.num_edges()))
        assert seen.numel() - split.graph.num_edges() in (0, 1)


def test_edge_exclusion_is_refused_on_a_distgraph():
    """DGL 2.1's DistGraph.sample_neighbors drops exclude_edges: refusing beats leaking."""
    from graphtrainer.distdgl.loader import DistEdgeLoader

    class FakeDistGraph:
        ntypes, etypes = ["_N"], ["_E"]

    with pytest.raises(ValueError, match="ignores exclude_edges"):
        DistEdgeLoader(FakeDistGraph(), torch.arange(4), [5], 2, exclude="self")


def test_edge_data_a_distgraph_lacks_is_refused_when_the_loader_is_made():
    """prefetch_edge_feats naming a key (or an edge type) the graph lacks: refused before the
    first batch, naming it and what the graph has."""
    import dgl

    from graphtrainer.distdgl.loader import DistEdgeLoader, DistNodeLoader

    class FakeDistGraph:
        ntypes, etypes, canonical_etypes = ["_N"], ["_E"], [("_N", "_E", "_N")]
        ndata, edata = {"feat": None}, {"w": None}

        def num_nodes(self):
            return 10

        def num_edges(self):
            return 20

    for spec, match in ((["weight"], r"no edge data \['weight'\] \(its edge data: \['w'\]\)"),
                        ({"cites": ["w"]}, r"no edge type \['cites'\]")):
        sampler = dgl.dataloading.NeighborSampler([2], prefetch_edge_feats=spec)
        with pytest.raises(ValueError, match=match):
            DistNodeLoader(FakeDistGraph(), torch.arange(4), sampler, 2)
        with pytest.raises(ValueError, match=match):
            DistEdgeLoader(FakeDistGraph(), torch.arange(4), sampler, 2)


# ---- options: refused before anything starts ------------------------------------------------
def test_bad_options_are_refused_with_the_fix(tmp_path, cora_parts):
    with pytest.raises(FileNotFoundError, match="python -m graphtrainer.cli.partition"):
        Trainer(distributed_graph=tmp_path / "nothing.json")
    with pytest.raises(ValueError, match="num_servers=0"):
        Trainer(distributed_graph=cora_parts, num_servers=0)
    with pytest.raises(ValueError, match=r"machine_rank=3: .* \[0, 1\)"):
        Trainer(distributed_graph=cora_parts, machine_rank=3)
    two = tmp_path / "ip2.txt"
    two.write_text("10.0.0.1\n10.0.0.2\n")
    with pytest.raises(ValueError, match="lists 2 machine.* has 1 partition.*--parts 2"):
        Trainer(distributed_graph=cora_parts, ip_config=two)
    same = tmp_path / "same.txt"
    same.write_text("127.0.0.1 30050\n127.0.0.1 30060\n")
    with pytest.raises(ValueError, match="127.0.0.1 more than once.*rpc.cc:395"):
        Trainer(distributed_graph=cora_parts, ip_config=same)
    names = tmp_path / "names.txt"
    names.write_text("node01 30050\n")
    with pytest.raises(ValueError, match="line 1.*not '<IPv4 address> \\[port\\]'"):
        Trainer(distributed_graph=cora_parts, ip_config=names)


def test_several_partitions_need_an_ip_config_and_a_known_machine(tmp_path, cora, monkeypatch):
    config = partition_graph(cora, "cora", 2, tmp_path / "p2").config
    with pytest.raises(ValueError, match="2 partitions, one per machine: pass ip_config="):
        Trainer(distributed_graph=config)
    ip = tmp_path / "ip.txt"
    ip.write_text("198.51.100.10\n198.51.100.11\n")  # addresses this machine does not have (RFC 5737)
    with pytest.raises(ValueError, match="cannot tell which machine.*machine_rank"):
        resolve_cluster(check_options(config, ip), 1)
    monkeypatch.setenv("GRAPHTRAINER_MACHINE_RANK", "1")
    cluster = resolve_cluster(check_options(config, ip), 2)
    assert (cluster.machine_rank, cluster.world_size, cluster.placement().first_rank) == (1, 4, 2)
    assert cluster.master_port == 30051 and cluster.placement().master_addr == "198.51.100.10"


def test_distributed_graph_is_not_started_under_torchrun(tmp_path, cora_parts, monkeypatch):
    for name, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="srun --ntasks-per-node=1"):
        Trainer(distributed_graph=cora_parts, max_epochs=1).fit(NodeClassification(cora_parts, **CORA))


def test_an_in_memory_task_is_refused_on_a_partitioned_graph(cora, cora_parts):
    """Its ids would be in the original numbering, the DistGraph's are not."""
    with pytest.raises(ValueError, match="partitioning numbers nodes differently"):
        Trainer(distributed_graph=cora_parts, max_epochs=1).fit(NodeClassification(cora, **CORA))


def test_a_partitioned_graph_reads_what_the_task_needs_without_loading_it(cora_parts):
    graph = PartitionedGraph(Path(cora_parts).parent)  # the folder works too
    assert (graph.num_nodes(), graph.num_edges(), graph.num_classes) == (2708, 10556, 7)
    assert graph.feature_shape("feat") == (1433,)
    with pytest.raises(KeyError, match="no node data 'missing'"):
        graph.feature_shape("missing")
