"""The config-file command line (``python -m graphtrainer``, :class:`GraphTaskCLI`): a
tutorial's config end to end on 2 ranks, the saved ``config.yaml`` repeating the run,
``--ckpt_path``, ``--print_config``, unknown keys named with the valid ones, and a clear
message without jsonargparse."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

pytest.importorskip("jsonargparse")  # the [cli] extra, in the tested set

from graphtrainer.cli import CONFIG_FILE, GraphTaskCLI  # noqa: E402

from conftest import rank_children  # noqa: E402
from tasks import RegressionTask  # noqa: E402
from tutorial_run import ROOT, tutorial_env  # noqa: E402

TUTORIAL_CONFIG = ROOT / "tutorials" / "01_quickstart_cora.yaml"


def _module(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """``python -m graphtrainer args...`` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "graphtrainer", *args], capture_output=True, text=True,
                          timeout=150, cwd=ROOT, env=tutorial_env(GRAPHTRAINER_CACHE=str(cache)))


def _epoch_rows(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("val_acc")]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tutorial_config_end_to_end_and_saved_config_repeats_the_run(tmp_path):
    runs = tmp_path / "runs"
    first = _module("fit", "--config", str(TUTORIAL_CONFIG), "--trainer.max_epochs", "2",
                    "--trainer.default_root_dir", str(runs), cache=tmp_path / "cache")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "epoch   1  train_loss" in first.stdout  # the config's PrintMetrics callback ran
    run0 = runs / "version_0"
    rows0 = _epoch_rows(run0 / "metrics.csv")
    assert len(rows0) == 2 and float(rows0[-1]["val_nodes"]) == 500  # 2 ranks scored the 500 nodes once
    assert list((run0 / "checkpoints").glob("epoch=*-val_acc=*.ckpt"))
    saved = yaml.safe_load((run0 / CONFIG_FILE).read_text())
    assert saved["trainer"]["max_epochs"] == 2 and saved["trainer"]["num_procs"] == 2
    assert saved["task"]["class_path"] == "graphtrainer.examples.node_classification.NodeClassification"
    assert saved["task"]["init_args"]["hidden"] == 128  # the tutorial's value, not the class default

    # The saved config alone repeats the run: a new folder with the same epoch rows.
    again = _module("fit", "--config", str(run0 / CONFIG_FILE), cache=tmp_path / "cache")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _epoch_rows(runs / "version_1" / "metrics.csv") == rows0

    # --ckpt_path: test the best checkpoint of those runs.
    test = _module("test", "--config", str(run0 / CONFIG_FILE), "--ckpt_path", "best", cache=tmp_path / "cache")
    assert test.returncode == 0, test.stderr[-3000:]
    metrics = dict(line.split() for line in test.stdout.splitlines() if line.startswith("test_"))
    assert float(metrics["test_nodes"]) == 1000 and 0.0 < float(metrics["test_acc"]) <= 1.0
    assert "ckpt_path='best': using" in test.stdout
    assert not rank_children()


def _write(path: Path, config: Dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _config(root: Path, **task_args: Any) -> Dict[str, Any]:
    return {"trainer": {"max_epochs": 2, "progress_bar": False, "default_root_dir": str(root)},
            "task": {"class_path": "tasks.RegressionTask", "init_args": {"n": 32, **task_args}}}


def _merge_into(target: Dict[str, Any], extra: Dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict):
            _merge_into(target.setdefault(key, {}), value)
        else:
            target[key] = value


@pytest.mark.parametrize("where, args, named, valid", [
    ("file: trainer", {"trainer": {"max_epoch": 3}}, "'trainer.max_epoch' (did you mean 'max_epochs'?)",
     "num_procs"),
    ("file: task", {"task": {"init_args": {"hiden": 3}}}, "'task.init_args.hiden' (did you mean 'hidden'?)",
     "tasks.RegressionTask.__init__ accepts"),
    ("file: top level", {"tranier": {"seed": 1}}, "'tranier' (did you mean 'trainer'?)", "ckpt_path"),
    ("flag", ["--trainer.max_epoch", "3"], "'trainer.max_epoch' (did you mean 'max_epochs'?)",
     "accumulate_grad_batches"),
])
def test_unknown_key_is_rejected_naming_the_valid_ones(tmp_path, capsys, where, args, named, valid):
    config = _config(tmp_path / "runs")
    extra: List[str] = []
    if isinstance(args, dict):
        _merge_into(config, args)
    else:
        extra = args
    with pytest.raises(SystemExit) as info:
        GraphTaskCLI(args=["fit", "--config", str(_write(tmp_path / "run.yaml", config)), *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown key {named}" in err and valid in err, err
    assert not (tmp_path / "runs").exists()  # rejected before anything ran


def _without_files(config: Any) -> Dict[str, Any]:
    values = config.as_dict()
    values.pop("config")  # which files were read, the only difference
    return values


def test_print_config_prints_a_config_that_loads_to_the_same_run(tmp_path, capsys):
    path = _write(tmp_path / "run.yaml", _config(tmp_path / "runs", hidden=8))
    with pytest.raises(SystemExit) as info:
        GraphTaskCLI(args=["fit", "--config", str(path), "--trainer.max_epochs", "3", "--print_config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # printed, nothing run
    loaded = yaml.safe_load(printed)
    assert loaded["trainer"]["max_epochs"] == 3 and loaded["task"]["init_args"]["hidden"] == 8

    reprinted = _write(tmp_path / "printed.yaml", loaded)
    cli = GraphTaskCLI(args=["fit", "--config", str(reprinted)])
    direct = cli.parser.parse_args(["fit", "--config", str(path), "--trainer.max_epochs", "3"]).fit
    assert _without_files(cli.config) == _without_files(direct)
    assert len(cli.trainer.history) == 3 and cli.task.hidden == 8 and cli.task.n == 32
    saved = yaml.safe_load((cli.trainer.log_dir / CONFIG_FILE).read_text())
    assert saved == yaml.safe_load(cli.command_parser.dump(direct))


def test_script_cli_with_its_own_task_class_and_subcommands(tmp_path, capsys):
    # GraphTaskCLI(MyTask): task arguments directly under task:, no class_path.
    root = tmp_path / "runs"
    config = {"trainer": {"max_epochs": 1, "progress_bar": False, "default_root_dir": str(root), "callbacks": [
        {"class_path": "graphtrainer.ModelCheckpoint", "init_args": {"monitor": "val_loss", "save_last": True}}]}}
    path = _write(tmp_path / "run.yaml", config)
    cli = GraphTaskCLI(RegressionTask, args=["fit", "--config", str(path), "--task.n", "24", "--task.hidden", "4"])
    assert type(cli.task) is RegressionTask and cli.task.n == 24 and cli.task.hidden == 4
    assert cli.subcommand == "fit" and cli.trainer.current_epoch == 1
    saved = root / "version_0" / CONFIG_FILE
    assert yaml.safe_load(saved.read_text())["task"]["n"] == 24
    capsys.readouterr()
    # A fresh task, its weights from the last checkpoint of that run.
    test = GraphTaskCLI(RegressionTask, args=["test", "--config", str(saved), "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert f"ckpt_path='last': using {root / 'version_0' / 'checkpoints' / 'last.ckpt'}" in out
    assert f"test_loss {test.result['test_loss']:.6g}" in out
    trained = cli.trainer.test(cli.task)["test_loss"]  # the fitted task, no checkpoint
    assert test.result["test_loss"] == pytest.approx(trained, rel=1e-6)
    assert not (root / "version_1").exists()  # test makes no run folder


def test_failed_start_leaves_no_run_folder_though_config_yaml_was_written(tmp_path):
    path = _write(tmp_path / "run.yaml", _config(tmp_path / "runs", fail_at_epoch=0))
    with pytest.raises(RuntimeError, match="planned failure at epoch 0"):
        GraphTaskCLI(args=["fit", "--config", str(path)])
    assert list((tmp_path / "runs").iterdir()) == []


def test_without_jsonargparse_the_message_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jsonargparse", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'graphtrainer\[cli\]'"):
        GraphTaskCLI(args=["fit"])
    from graphtrainer.__main__ import _run

    monkeypatch.setattr(sys, "argv", ["graphtrainer", "fit"])
    with pytest.raises(SystemExit) as info:
        _run()
    assert info.value.code == 2
    assert "pip install 'graphtrainer[cli]'" in capsys.readouterr().err


def _refusal(tmp_path: Path, capsys: Any, config: Dict[str, Any], *flags: str) -> str:
    """The one ``error:`` line GraphTaskCLI prints for ``config`` and ``flags`` (status 2)."""
    with pytest.raises(SystemExit) as info:
        GraphTaskCLI(args=["fit", "--config", str(_write(tmp_path / "run.yaml", config)), *flags])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    return lines[0]


def _with_callbacks(root: Path, *callbacks: Dict[str, Any]) -> Dict[str, Any]:
    config = _config(root)
    config["trainer"]["callbacks"] = list(callbacks)
    return config


_STOP = {"class_path": "graphtrainer.EarlyStopping", "init_args": {"monitor": "val_loss"}}
_CKPT = {"class_path": "graphtrainer.ModelCheckpoint", "init_args": {"monitor": "val_loss"}}


@pytest.mark.parametrize("callbacks, flags, expected", [
    ([{"class_path": "graphtrainer.EarlyStopping", "init_args": {"monitr": "val_loss"}}], [],
     "error: unknown key 'trainer.callbacks[0].init_args.monitr' (did you mean 'monitor'?); "
     "graphtrainer.EarlyStopping.__init__ accepts monitor, mode,"),
    ([_STOP], ["--trainer.callbacks.patiance", "3"],
     "error: unknown key 'trainer.callbacks[0].init_args.patiance' (did you mean 'patience'?)"),
    ([_STOP, _CKPT], ["--trainer.callbacks.save_lst", "true"],  # a flag applies to the list's last item
     "error: unknown key 'trainer.callbacks[1].init_args.save_lst' (did you mean 'save_last'?)"),
    ([_CKPT, {"class_path": "graphtrainer.EarlyStopping", "init_args": {"patience": "abc"}}], [],
     "error: trainer.callbacks[1].init_args.patience: expected int, got 'abc'"),
    ([{"class_path": "graphtrainer.EarlyStoping"}], [],
     "error: trainer.callbacks[0].class_path: cannot import 'graphtrainer.EarlyStoping'"),
    ([_CKPT, {"class_path": "graphtrainer.EarlyStopping", "init_args": {"monitor": "val_loss", "mode": "maximum"}}],
     [], "error: trainer.callbacks[1] (graphtrainer.EarlyStopping): mode='maximum': use 'min' or 'max'"),
    ([], ["--trainer.max_epochs", "two"], "error: trainer.max_epochs: expected int, got 'two'"),
    ([], ["--task.init_args.hidden", "6.5"], "error: task.init_args.hidden: expected int, got '6.5'"),
    # The failing item of a list is named by its index, whichever way the list was given.
    ([_CKPT, {"class_path": "graphtrainer.EarlyStopping", "monitr": "val_loss"}], [],  # arguments beside class_path
     "error: unknown key 'trainer.callbacks[1].monitr' (did you mean 'init_args.monitor'?); trainer.callbacks[1] "
     "holds class_path and init_args; graphtrainer.EarlyStopping.__init__ accepts monitor, mode,"),
    ([_CKPT, {"class_path": "EarlyStopping", "init_args": {"monitr": "val_loss"}}], [],  # a short class name
     "error: unknown key 'trainer.callbacks[1].init_args.monitr' (did you mean 'monitor'?)"),
    ([_CKPT, {"class_path": "graphtrainer.EarlyStopping", "init_arg": {"monitor": "val_loss"}}], [],
     "error: unknown key 'trainer.callbacks[1].init_arg' (did you mean 'init_args'?)"),
    ([_CKPT, {"clas_path": "graphtrainer.EarlyStopping"}], [],
     "error: unknown key 'trainer.callbacks[1].clas_path' (did you mean 'class_path'?)"),
    ([_CKPT, "graphtrainer.EarlyStoping"], [],
     "error: trainer.callbacks[1].class_path: cannot import 'graphtrainer.EarlyStoping'"),
    ([], ["--trainer.callbacks", "[{class_path: graphtrainer.ModelCheckpoint}, "
          "{class_path: graphtrainer.EarlyStopping, monitr: val_loss}]"],
     "error: unknown key 'trainer.callbacks[1].monitr' (did you mean 'init_args.monitor'?)"),
    ([], ["--trainer.callbacks+=graphtrainer.ModelCheckpoint",
          "--trainer.callbacks+={class_path: graphtrainer.EarlyStopping, init_args: {monitr: val_loss}}"],
     "error: unknown key 'trainer.callbacks[1].init_args.monitr' (did you mean 'monitor'?)"),
    ([], ["--trainer.callbacks+=graphtrainer.ModelCheckpoint", "--trainer.callbacks.monitor", "val_loss",
          "--trainer.callbacks+=graphtrainer.EarlyStopping", "--trainer.callbacks.monitr", "val_loss"],
     "error: unknown key 'trainer.callbacks[1].init_args.monitr' (did you mean 'monitor'?)"),
])
def test_nested_refusals_name_the_real_path_in_one_line(tmp_path, capsys, callbacks, flags, expected):
    line = _refusal(tmp_path, capsys, _with_callbacks(tmp_path / "runs", *callbacks), *flags)
    assert line.startswith(expected), line


def test_task_arguments_beside_its_class_path_say_they_go_under_init_args(tmp_path, capsys):
    config = _config(tmp_path / "runs")
    config["task"] = {"class_path": "tasks.RegressionTask", "hiden": 8}
    line = _refusal(tmp_path, capsys, config)
    assert line.startswith("error: unknown key 'task.hiden' (did you mean 'init_args.hidden'?); task holds "
                           "class_path and init_args; tasks.RegressionTask.__init__ accepts n, d, hidden,"), line


def test_untyped_task_argument_takes_its_defaults_type(tmp_path, capsys):
    config = _config(tmp_path / "runs")
    config["task"]["class_path"] = "cli_tasks.UntypedTask"
    line = _refusal(tmp_path, capsys, config, "--task.init_args.hidden", "6.5")
    assert line.startswith("error: task.init_args.hidden: expected int (the type of its default 16;"), line
    line = _refusal(tmp_path, capsys, config, "--task.init_args.hidden", "[8]")
    assert "task.init_args.hidden: expected int" in line and "got [8]" in line
    # Values of the default's type pass: an int for a float default, digits for a str default.
    config["trainer"]["max_epochs"] = 1
    cli = GraphTaskCLI(args=["fit", "--config", str(_write(tmp_path / "ok.yaml", config)),
                             "--task.init_args.hidden", "6", "--task.init_args.name", "7", "--task.init_args.lr", "1"])
    assert cli.task.hidden == 6 and cli.task.name == "7" and cli.task.lr == 1


@pytest.mark.slow  # a fresh interpreter importing torch and dgl
@pytest.mark.timeout(200)
def test_module_refusal_is_one_error_line_and_status_2(tmp_path):
    # What a user running python -m graphtrainer sees: no jsonargparse traceback.
    config = _with_callbacks(tmp_path / "runs", {"class_path": "graphtrainer.EarlyStopping",
                                                 "init_args": {"monitor": "val_loss", "mode": "maximum"}})
    env = tutorial_env(PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'helpers'}")  # tasks.RegressionTask
    config_file = str(_write(tmp_path / "run.yaml", config))
    out = subprocess.run([sys.executable, "-m", "graphtrainer", "fit", "--config", config_file],
                         capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: trainer.callbacks[0] (graphtrainer.EarlyStopping): "
                                  "mode='maximum': use 'min' or 'max'"), out.stderr
    assert not (tmp_path / "runs").exists()


def test_graphtaskcli_is_exported_from_the_package(monkeypatch):
    import graphtrainer

    assert graphtrainer.GraphTaskCLI is GraphTaskCLI and "GraphTaskCLI" in graphtrainer.__all__
    monkeypatch.setitem(sys.modules, "jsonargparse", None)  # as if the [cli] extra were missing
    with pytest.raises(ImportError, match=r"pip install 'graphtrainer\[cli\]'"):
        exec("from graphtrainer import GraphTaskCLI", {})


@pytest.mark.parametrize("key, value, way", [
    ("accelerator", "gpu", "gpus=N (one rank per GPU) or num_procs=N (CPU ranks)"),  # not "did you mean 'allocator'"
    ("devices", 2, "gpus=N or gpus=[0, 1] (GPUs), or num_procs=N (CPU ranks)"),
    ("strategy", "ddp", "every run is DDP; launcher='fork', 'spawn' or 'forkserver'"),
])
@pytest.mark.parametrize("given", ["file", "flag"])
def test_lightning_trainer_keys_name_graphtrainers_way(tmp_path, capsys, key, value, way, given):
    config = _config(tmp_path / "runs")
    flags: List[str] = []
    if given == "file":
        config["trainer"][key] = value
    else:
        flags = [f"--trainer.{key}", str(value)]
    line = _refusal(tmp_path, capsys, config, *flags)
    assert line.startswith(f"error: trainer.{key} is Lightning's; graphtrainer: {way}"), line


def _ckpt_config(root: Path, lr: float) -> Dict[str, Any]:
    config = _with_callbacks(root, {"class_path": "graphtrainer.ModelCheckpoint",
                                    "init_args": {"monitor": "val_loss", "save_last": True}})
    config["task"]["init_args"]["lr"] = lr
    return config


@pytest.mark.parametrize("flags, expected", [
    (["--ckpt_path", "best"], "error: ckpt_path='best': no best checkpoint found in "),
    (["--ckpt_path", "nosuch.ckpt"], "error: checkpoint nosuch.ckpt does not exist: pass an existing "
                                     "file, or ckpt_path='last' / 'best'"),
])
@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_ckpt_path_that_names_nothing_is_one_error_line_and_status_2(tmp_path, capsys, flags, expected, command):
    path = _write(tmp_path / "run.yaml", _ckpt_config(tmp_path / "runs", 0.1))
    with pytest.raises(SystemExit) as info:  # before: a traceback, status 1 (a missing file: from every rank)
        GraphTaskCLI(args=[command, "--config", str(path), *flags])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_last_and_best_with_a_runs_saved_config_mean_that_runs_checkpoints(tmp_path, capsys):
    root = tmp_path / "runs"
    for lr in (0.1, 0.01):  # two runs: version_1 is the newest
        GraphTaskCLI(args=["fit", "--config", str(_write(tmp_path / "run.yaml", _ckpt_config(root, lr)))])
    capsys.readouterr()
    for which in ("best", "last"):
        for run in ("version_0", "version_1"):
            GraphTaskCLI(args=["test", "--config", str(root / run / CONFIG_FILE), "--ckpt_path", which])
            out = capsys.readouterr().out
            assert f"ckpt_path='{which}': using {root / run / 'checkpoints'}" in out, out  # before: version_1's
    # A config that is no run's own: the newest run's, as before.
    GraphTaskCLI(args=["test", "--config", str(tmp_path / "run.yaml"), "--ckpt_path", "best"])
    assert f"using {root / 'version_1' / 'checkpoints'}" in capsys.readouterr().out
    # fit resumes that run into a new folder.
    cli = GraphTaskCLI(args=["fit", "--config", str(root / "version_0" / CONFIG_FILE), "--ckpt_path", "last",
                             "--trainer.max_epochs", "3"])
    assert f"using {root / 'version_0' / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().out
    assert [row["epoch"] for row in cli.trainer.history] == [2] and cli.trainer.log_dir == root / "version_2"
