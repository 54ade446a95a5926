"""The command line of the tutorials that read a YAML config (``01_quickstart_cora.yaml``,
``07_link_prediction.yaml``, beside their scripts): :class:`graphtrainer.cli.GraphTaskCLI`
plus the flags every tutorial has.

    python tutorials/01_quickstart_cora.py                        # its .yaml, as is
    python tutorials/01_quickstart_cora.py --trainer.max_epochs 5 --task.init_args.hidden 64
    python tutorials/01_quickstart_cora.py --print_config         # the resolved config
    python -m graphtrainer fit --config tutorials/01_quickstart_cora.yaml   # the fit alone
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, Type

from graphtrainer import GraphTask
from graphtrainer.cli import GraphTaskCLI


class TutorialCLI(GraphTaskCLI):
    """The script's ``.yaml`` read first; ``--fast`` (the smoke test's epochs), ``--out``
    (``summary.json``'s folder) and ``--root-dir`` (overrides ``trainer.default_root_dir``).

    ``task_class``: the script's own task, its arguments directly under ``task:``
    (jsonargparse cannot import a class from a module whose name starts with a digit, as
    the tutorials' do); without it ``task:`` holds a ``class_path`` and ``init_args``.
    """

    def __init__(self, script: str, fast_epochs: int, argv: Optional[Sequence[str]] = None,
                 description: Optional[str] = None, task_class: Optional[Type[GraphTask]] = None):
        self.fast_epochs = fast_epochs
        super().__init__(task_class, subclass_mode=task_class is None, args=argv, run=False,
                         prog=f"python tutorials/{Path(script).name}",
                         default_config_files=[Path(script).with_suffix(".yaml")], description=description)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--fast", action="store_true",
                            help=f"{self.fast_epochs} epochs (trainer.max_epochs): the CI smoke test")
        parser.add_argument("--out", type=Optional[str], default=None,
                            help="also write the result as JSON to OUT/summary.json")
        parser.add_argument("--root-dir", type=Optional[str], default=None,
                            help="run folders and checkpoints (default: the config's trainer.default_root_dir)")

    def before_instantiate(self, config: Any) -> None:
        if config.fast:
            config.trainer.max_epochs = self.fast_epochs
        if config.root_dir:
            config.trainer.default_root_dir = config.root_dir
