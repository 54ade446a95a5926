"""A parent and its child for tests/unit/test_die_with_parent.py, in real processes.

``python parent_death_script.py parent DIR START WHEN``: start a child (START: ``fork``, a
multiprocessing child that finds its parent itself; ``forkserver``, one forked by
multiprocessing's fork server, whose parent is that server; or ``popen``, an exec'd child
told the parent's pid), print its pid, then either exit as soon as the child is ready (WHEN=``before``:
the child calls ``die_with_parent`` only once this process is gone) or sleep until killed
(WHEN=``after``: the child has called it already).

The child writes ``DIR/ready`` before its call (WHEN=before), ``DIR/armed`` after it
(WHEN=after), and ``DIR/survived`` if it lives on past a call made with its parent gone.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from graphtrainer.process.parent import die_with_parent


def _touch(path: Path, text: str = "") -> None:
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").rename(path)  # whole, when seen


def child(folder: str, when: str, parent: int, told: Optional[int]) -> None:
    out = Path(folder)
    if when == "before":
        _touch(out / "ready")
        while os.getppid() == parent:  # until the parent has exited and this one was handed on
            time.sleep(0.005)
        die_with_parent(told)
        _touch(out / "survived")
    else:
        die_with_parent(told)
        _touch(out / "armed")
    time.sleep(120)


def parent(folder: str, start: str, when: str) -> None:
    me = os.getpid()
    if start in ("fork", "forkserver"):
        proc = mp.get_context(start).Process(target=child, args=(folder, when, me, None))
        proc.start()
        pid = proc.pid
    else:
        pid = subprocess.Popen([sys.executable, __file__, "child", folder, when, str(me)]).pid
    print(pid, flush=True)
    if when == "before":
        while not (Path(folder) / "ready").exists():
            time.sleep(0.005)
        os._exit(0)  # no join: the child is left running, and handed to a reaper
    time.sleep(120)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "parent":
        parent(*args)
    else:
        folder, when, told = args
        child(folder, when, int(told), int(told))
