"""Config-file command line, on jsonargparse (``pip install "graphtrainer[cli]"``).

    python -m graphtrainer fit --config run.yaml [--trainer.max_epochs 5] [--ckpt_path last]
    python -m graphtrainer test --config run.yaml --ckpt_path best
    python -m graphtrainer fit --config run.yaml --print_config     # the resolved config, then exit

A config holds ``trainer:`` (any :class:`~graphtrainer.Trainer` argument, read from its
signature; callbacks as ``class_path``/``init_args``), ``task:`` (a ``class_path`` to a
:class:`~graphtrainer.GraphTask` subclass and its ``init_args``) and ``ckpt_path:``. In a
script of your own, :class:`GraphTaskCLI` does the same for your task class. ``fit`` saves
the resolved config as ``config.yaml`` in the run's ``version_<n>/`` folder; passing that
file back as ``--config`` repeats the run.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Type

from .callbacks.base import Callback
from .task import GraphTask
from .trainer import Trainer

#: The entry points a subcommand can name.
SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: The file ``fit`` writes the resolved config to, in the run folder.
CONFIG_FILE = "config.yaml"


def require_jsonargparse() -> Any:
    """The jsonargparse module; ImportError saying how to install it when missing."""
    try:
        import jsonargparse
    except ImportError as err:
        raise ImportError("the graphtrainer command line needs jsonargparse: pip install 'graphtrainer[cli]' "
                          "(or pip install jsonargparse)") from err
    return jsonargparse


class SaveConfig(Callback):
    """Writes the resolved config into the run folder at the start of ``fit`` (rank 0)."""

    def __init__(self, text: str, name: str = CONFIG_FILE):
        self.text, self.name = text, name

    def setup(self, trainer: Trainer, task: GraphTask, stage: str) -> None:
        if stage == "fit" and trainer.rank == 0 and trainer.log_dir is not None:
            (Path(trainer.log_dir) / self.name).write_text(self.text, encoding="utf-8")


class GraphTaskCLI:
    """Builds a :class:`~graphtrainer.Trainer` and a task from config files and flags, and
    runs a subcommand.

    ``GraphTaskCLI(MyTask)`` in a script: ``python train.py fit --config run.yaml`` with
    ``task:`` holding ``MyTask``'s ``__init__`` arguments directly. ``GraphTaskCLI()`` (what
    ``python -m graphtrainer`` runs) or ``subclass_mode=True``: ``task:`` holds a
    ``class_path`` and ``init_args``. Task arguments are plain values (numbers, strings,
    lists, dicts), checked against the annotations of ``__init__``.

    ``run=False``: no subcommand; the script parses, gets :attr:`trainer` and :attr:`task`
    and calls their methods itself (a tutorial that fits, then tests and predicts).
    Override :meth:`add_arguments` to add the script's own flags and
    :meth:`before_instantiate` to adjust the parsed config. After construction:
    :attr:`config` (the parsed namespace), :attr:`trainer`, :attr:`task`, and with
    ``run=True`` :attr:`subcommand` and :attr:`result` (what the entry point returned).

    An unknown key (in a file or on the command line) exits with status 2 and a message
    naming the valid keys there.
    """

    def __init__(self, task_class: Optional[Type[GraphTask]] = None, *, subclass_mode: bool = False,
                 args: Optional[Sequence[str]] = None, run: bool = True,
                 default_config_files: Sequence[str | Path] = (), prog: Optional[str] = None,
                 description: Optional[str] = None, save_config: bool = True):
        if task_class is not None and not (inspect.isclass(task_class) and issubclass(task_class, GraphTask)):
            raise TypeError(f"GraphTaskCLI(task_class={task_class!r}): give a GraphTask subclass")
        self.task_class = task_class or GraphTask
        self.subclass_mode = subclass_mode or task_class is None
        self.save_config = save_config
        self.subcommand: Optional[str] = None
        self.result: Any = None
        ja = require_jsonargparse()
        files = [str(f) for f in default_config_files]
        if run:
            self.parser = ja.ArgumentParser(prog=prog, description=description, exit_on_error=False,
                                            allow_abbrev=False)
            commands = self.parser.add_subcommands(required=True, dest="subcommand")
            self._subparsers = {}
            for name in SUBCOMMANDS:
                sub = self._command_parser(ja, files)
                commands.add_subcommand(name, sub, help=f"Trainer.{name}(task, ckpt_path)")
                self._subparsers[name] = sub
        else:
            self.parser = self._command_parser(ja, files, prog=prog, description=description)
        cfg = self._parse(args)
        if run:
            self.subcommand = cfg.subcommand
            cfg = cfg[self.subcommand]
        #: The parsed config of the command that runs.
        self.config = cfg
        self.before_instantiate(cfg)
        #: The parser of the command that runs (its ``dump`` writes a config).
        self.command_parser = parser = self._subparsers[self.subcommand] if run else self.parser
        text = parser.dump(cfg)
        # instantiate() replaced instantiate_classes() in jsonargparse 4.49.
        init = getattr(parser, "instantiate", None) or parser.instantiate_classes
        init = init(cfg)
        #: The task, built from ``task:``.
        self.task: GraphTask = self._make_task(cfg.task)
        #: The trainer, built from ``trainer:``.
        self.trainer: Trainer = init.trainer
        if save_config:
            self.trainer.callbacks.append(SaveConfig(text))
        if run:
            self.result = self.run_subcommand()

    # ---- hooks for a script's own CLI ---------------------------------------------------
    def add_arguments(self, parser: Any) -> None:
        """Add the script's own arguments to ``parser`` (a jsonargparse ``ArgumentParser``)."""

    def before_instantiate(self, config: Any) -> None:
        """Adjust the parsed ``config`` (a jsonargparse ``Namespace``) before the trainer and
        the task are built; what is saved as ``config.yaml`` includes the change."""

    # ---- running ----------------------------------------------------------------------
    def run_subcommand(self) -> Any:
        """``Trainer.<subcommand>(task, ckpt_path)``; rank 0 prints what validate/test/predict return."""
        method = getattr(self.trainer, self.subcommand)
        out = method(self.task, ckpt_path=self.config.ckpt_path)
        if self.trainer.rank != 0:  # under torchrun or Slurm every rank runs this; one prints
            return out
        if self.subcommand in ("validate", "test"):
            for name in sorted(out):
                print(f"{name} {out[name]:.6g}", flush=True)
        elif self.subcommand == "predict":
            print(f"predict: {tuple(out.shape)} {out.dtype}", flush=True)
        return out

    # ---- parsing ----------------------------------------------------------------------
    def _command_parser(self, ja: Any, files: List[str], **kwargs: Any) -> Any:
        parser = ja.ArgumentParser(exit_on_error=False, allow_abbrev=False, default_config_files=files, **kwargs)
        parser.add_argument("--config", action=ja.ActionConfigFile, help="a YAML config file (repeatable)")
        parser.add_class_arguments(Trainer, "trainer", instantiate=True)
        if self.subclass_mode:
            parser.add_subclass_arguments(self.task_class, "task", instantiate=False, required=True)
        else:
            parser.add_class_arguments(self.task_class, "task", instantiate=False)
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help='resume (fit) or load (validate/test/predict): "last", "best" or a path')
        self.add_arguments(parser)
        return parser

    def _parse(self, args: Optional[Sequence[str]]) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        try:
            return self.parser.parse_args(args)
        except Exception as err:  # jsonargparse raises argparse.ArgumentError (exit_on_error=False)
            print(f"error: {explain_parse_error(err, self._all_parsers())}", file=sys.stderr, flush=True)
            raise SystemExit(2) from err

    def _all_parsers(self) -> List[Any]:
        return list(getattr(self, "_subparsers", {}).values()) or [self.parser]

    def _make_task(self, cfg: Any) -> GraphTask:
        if not self.subclass_mode:
            return self.task_class(**_plain(cfg))
        cls = import_class(cfg.class_path)
        if not (inspect.isclass(cls) and issubclass(cls, GraphTask)):
            raise TypeError(f"task.class_path {cfg.class_path!r} is not a GraphTask subclass")
        return cls(**_plain(cfg.init_args or {}))


def _plain(namespace: Any) -> Dict[str, Any]:
    return namespace.as_dict() if hasattr(namespace, "as_dict") else dict(namespace)


def import_class(path: str) -> Any:
    """The object ``"package.module.Name"`` names."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


_UNKNOWN_OPTION = re.compile(r"does not accept option '([\w.]+)'")
_UNKNOWN_INIT_ARG = re.compile(r"Problem with given class_path '([\w.]+)':\s+Option '([\w.]+)' is not accepted")
_UNKNOWN_TOP = re.compile(r"unrecognized arguments: (\S+)")


def explain_parse_error(err: BaseException, parsers: Sequence[Any]) -> str:
    """jsonargparse's message, plus the valid keys where it rejected an unknown one."""
    message = str(err).strip()
    match = _UNKNOWN_INIT_ARG.search(message)
    if match:
        class_path, key = match.groups()
        try:
            params = inspect.signature(import_class(class_path).__init__).parameters
            valid = [p for p in params if p != "self" and params[p].kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        except Exception:  # the class cannot be imported: jsonargparse's message says so
            return message
        return _unknown(f"task.init_args.{key}", key, valid, f"{class_path}.__init__ accepts")
    match = _UNKNOWN_OPTION.search(message) or _UNKNOWN_TOP.search(message)
    if match:
        parts = match.group(1).lstrip("-").split("=", 1)[0].split(".")
        dests = {a.dest for p in parsers for a in p._actions if a.dest not in ("help", "==SUPPRESS==")}
        for i, part in enumerate(parts):  # the first part that is not a key where it stands
            prefix = ".".join(parts[:i]) + "." if i else ""
            valid = sorted({d[len(prefix):].split(".")[0] for d in dests if d.startswith(prefix)})
            if part not in valid:
                if not valid:
                    break
                group = prefix.rstrip(".")
                return _unknown(".".join(parts[:i + 1]), part, valid,
                                f"{group} accepts" if group else "valid top-level keys:")
    return message


def _unknown(key: str, leaf: str, valid: Sequence[str], intro: str) -> str:
    close = difflib.get_close_matches(leaf, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; {intro} {', '.join(valid)}"


def main(args: Optional[Sequence[str]] = None) -> Any:
    """``python -m graphtrainer``: a subcommand, a config and a task class path."""
    return GraphTaskCLI(args=args, prog="python -m graphtrainer",
                        description="Run Trainer.fit/validate/test/predict from a config file.").result
