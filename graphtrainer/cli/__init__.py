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

import inspect
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from ..callbacks.base import Callback
from .errors import check_untyped, explain_parse_error, import_class, one_line
from ..task import GraphTask
from ..trainer import Trainer

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

    Every refused config exits with status 2 and one ``error:`` line naming the key's full
    path, a list's item by its index (``trainer.callbacks[1].init_args.monitr``): an unknown
    key (with the valid keys there; a class's arguments beside its ``class_path`` are one), a
    value of the wrong type, a class that cannot be imported, a constructor that
    refuses its arguments (``trainer.callbacks[0] (graphtrainer.EarlyStopping): mode=...``).
    A task argument without an annotation takes the type of its default: ``hidden=16``
    refuses ``6.5`` at parse time, before any rank starts.
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
        task_class, task_args = self._task_spec(cfg.task)
        #: The trainer, built from ``trainer:``.
        self.trainer: Trainer = self._make_trainer(parser, cfg)
        #: The task, built from ``task:``.
        self.task: GraphTask = self._make_task(task_class, task_args)
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
        """``Trainer.<subcommand>(task, ckpt_path)``; rank 0 prints what validate/test/predict return.
        ``ckpt_path`` "last"/"best" with a run's saved ``config.yaml`` as ``--config`` means
        that run's checkpoint (else the newest run's); one that names nothing is refused here."""
        method = getattr(self.trainer, self.subcommand)
        try:  # a config problem: one error line, before any rank starts
            ckpt_path = self.trainer._resolve_ckpt(self.config.ckpt_path, fresh_if_none=self.subcommand == "fit",
                                                   run_dir=self._config_run_dir())
        except (ValueError, FileNotFoundError) as err:
            _refuse(one_line(str(err)), err)
        out = method(self.task, ckpt_path=ckpt_path)
        if self.trainer.rank != 0:  # under torchrun or Slurm every rank runs this; one prints
            return out
        if self.subcommand in ("validate", "test"):
            for name in sorted(out):
                print(f"{name} {out[name]:.6g}", flush=True)
        elif self.subcommand == "predict":
            print(f"predict: {tuple(out.shape)} {out.dtype}", flush=True)
        return out

    def _config_run_dir(self) -> Optional[Path]:
        """The run folder whose saved config was given last as ``--config``
        (``<root>/version_<n>/config.yaml``), if one was."""
        for file in reversed(self.config.get("config") or []):
            path = Path(str(file))
            if path.name == CONFIG_FILE and re.fullmatch(r"version_\d+", path.parent.name):
                return path.parent
        return None

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
            _refuse(explain_parse_error(err, self._all_parsers(), lambda key: self._flag_index(args, key)), err)

    def _flag_index(self, args: List[str], key: str) -> Optional[int]:
        """The index of the item of list ``key`` that the refused flag applies to: the list's
        last item for ``--<key>.<init arg>``, a new item for ``--<key>+=``. The refused flag is
        the first of those whose arguments up to it no longer parse; None when that cannot be
        told (arguments before it that do not parse alone) or ``key`` holds no list."""
        for at, arg in enumerate(args):
            flag = arg.split("=", 1)[0]
            appends = flag == f"--{key}+"
            if not (appends or flag.startswith(f"--{key}.")):
                continue
            refused = self._refusal(args[:at + (1 if "=" in arg else 2)])
            if refused is None:
                continue  # this flag parses: not the one refused
            if f'Parser key "{key}"' not in refused:
                return None  # the arguments up to it fail for another reason
            items = self._parsed(args[:at], key)
            if not isinstance(items, list):
                return None
            index = len(items) if appends else len(items) - 1
            return index if index >= 0 else None
        return None

    def _refusal(self, args: List[str]) -> Optional[str]:
        """Why ``args`` do not parse, None when they do."""
        try:
            self.parser.parse_args(args)
        except Exception as err:  # jsonargparse raises argparse.ArgumentError (exit_on_error=False)
            return str(err)
        return None

    def _parsed(self, args: List[str], key: str) -> Any:
        """``key``'s value after ``args``; None when they do not parse alone."""
        try:
            cfg = self.parser.parse_args(args)
        except Exception:  # the arguments before the flag do not parse alone: say no index
            return None
        cfg = cfg[cfg.subcommand] if "subcommand" in cfg else cfg
        return cfg.get(key)

    def _make_trainer(self, parser: Any, cfg: Any) -> Trainer:
        """The trainer and its callbacks; a constructor's refusal is one ``error:`` line
        naming the callback (``trainer.callbacks[i]``) or the trainer."""
        # instantiate() replaced instantiate_classes() in jsonargparse 4.49.
        init = getattr(parser, "instantiate", None) or parser.instantiate_classes
        try:
            return init(cfg).trainer
        except Exception as err:
            cause = _root_cause(err)
            if not isinstance(cause, (ValueError, TypeError)):
                raise
            _refuse(f"{self._failing_part(cfg)}: {one_line(str(cause))}", err)

    @staticmethod
    def _failing_part(cfg: Any) -> str:
        """``trainer.callbacks[i] (class)`` for the first callback whose constructor refuses
        its arguments, else ``trainer``; only called once construction failed."""
        for i, spec in enumerate(cfg.trainer.get("callbacks") or []):
            try:
                import_class(spec.class_path)(**_plain(spec.get("init_args") or {}))
            except Exception:  # this one refuses: name it
                return f"trainer.callbacks[{i}] ({spec.class_path})"
        return "trainer"

    def _task_spec(self, cfg: Any) -> Tuple[Type[GraphTask], Dict[str, Any]]:
        """The task class and its arguments, checked before anything is built: an argument
        without an annotation must have its default's type."""
        if self.subclass_mode:
            cls, values, where = import_class(cfg.class_path), _plain(cfg.init_args or {}), "task.init_args"
            if not (inspect.isclass(cls) and issubclass(cls, GraphTask)):
                _refuse(f"task.class_path {cfg.class_path!r} is not a GraphTask subclass")
        else:
            cls, values, where = self.task_class, _plain(cfg), "task"
        problem = check_untyped(cls, values, where)
        if problem:
            _refuse(problem)
        return cls, values

    def _all_parsers(self) -> List[Any]:
        return list(getattr(self, "_subparsers", {}).values()) or [self.parser]

    def _make_task(self, cls: Type[GraphTask], values: Dict[str, Any]) -> GraphTask:
        try:
            return cls(**values)
        except (ValueError, TypeError) as err:  # the task refused its arguments: one line naming it
            _refuse(f"task ({cls.__module__}.{cls.__qualname__}): {one_line(str(err))}", err)


def _plain(namespace: Any) -> Dict[str, Any]:
    return namespace.as_dict() if hasattr(namespace, "as_dict") else dict(namespace)


def _refuse(message: str, cause: Optional[BaseException] = None) -> None:
    """The one ``error:`` line and status 2 of every refused config."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2) from cause


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def main(args: Optional[Sequence[str]] = None) -> Any:
    """``python -m graphtrainer``: a subcommand, a config and a task class path."""
    return GraphTaskCLI(args=args, prog="python -m graphtrainer",
                        description="Run Trainer.fit/validate/test/predict from a config file.").result
