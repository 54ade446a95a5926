"""The user guide (docs/, mkdocs.yml) and README.md: the site builds in strict mode, and
every ```python block is either run here or taken from a file that a test runs.

A block is one of three kinds, told by the HTML comment on the line above it:

- none: a complete program. The slow test runs it as a script, with ``max_epochs=<n>``
  cut to 1 so that it stays short (Cora, 2 ranks).
- ``<!-- run: quick -->``: a short program that trains nothing; the quick test runs it in
  its own process (torch and DGL are imported there already).
- ``<!-- from: PATH -->``: an excerpt of PATH (a tutorial or example that a test runs):
  its lines must appear in PATH, in order and together, and some test must name PATH.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.M | re.S)
MARKER = re.compile(r"<!-- (from|run): (\S+) -->\n$")
MAX_EPOCHS = re.compile(r"max_epochs=\d+")


class Block(NamedTuple):
    page: Path
    line: int
    kind: str      # "program", "quick" or "from"
    source: str    # PATH for "from"
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks() -> List[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for fence in FENCE.finditer(text):
            if fence.group(1) not in ("python", "py", "python3"):
                continue
            before = text[:fence.start()]
            line = before.count("\n") + 1
            marker = MARKER.search(before[-300:])
            if marker is None:
                kind, source = "program", ""
            elif marker.group(1) == "run":
                assert marker.group(2) == "quick", f"{page.name}:{line}: <!-- run: quick --> is the only run marker"
                kind, source = "quick", ""
            else:
                kind, source = "from", marker.group(2)
            blocks.append(Block(page, line, kind, source, fence.group(2)))
    return blocks


BLOCKS = python_blocks()


def run_block(block: Block, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    script = tmp_path / "block.py"
    script.write_text(MAX_EPOCHS.sub("max_epochs=1", block.code))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DGLBACKEND": "pytorch", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


def build_site(config_file: Path, site: Path) -> None:
    """``mkdocs build --strict``, in this process (an interpreter start less); raises
    ``mkdocs.exceptions.Abort`` when any warning was logged."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(config_file), site_dir=str(site), strict=True))


def is_excerpt(code: str, source_text: str) -> bool:
    """True when the non-blank lines of ``code`` are consecutive non-blank lines of the source."""
    wanted = [line.rstrip() for line in code.splitlines() if line.strip()]
    have = [line.rstrip() for line in source_text.splitlines() if line.strip()]
    return bool(wanted) and any(have[i:i + len(wanted)] == wanted for i, line in enumerate(have) if line == wanted[0])


def test_is_excerpt_tells_a_copy_from_a_changed_one():
    source = "def f():\n    a = 1\n\n    return a\n\nx = f()\n"
    assert is_excerpt("def f():\n    a = 1\n    return a\n", source)
    assert not is_excerpt("def f():\n    a = 2\n    return a\n", source)      # a changed line
    assert not is_excerpt("def f():\n    return a\n    a = 1\n", source)      # reordered
    assert not is_excerpt("def f():\n    a = 1\nx = f()\n", source)           # a line left out
    assert not is_excerpt("", source)


def test_site_builds_in_strict_mode(tmp_path, caplog):
    site = tmp_path / "site"
    build_site(ROOT / "mkdocs.yml", site)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    pages = [p.stem for p in (ROOT / "docs").glob("*.md") if p.stem != "index"]
    assert (site / "index.html").is_file()
    assert [p for p in pages if not (site / p / "index.html").is_file()] == []
    # The architecture page shows ARCHITECTURE.md itself (docs/hooks.py includes it).
    first_heading = next(line for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines() if line.startswith("# "))
    words = re.sub(r"[`#]", "", first_heading).split()
    assert all(w in (site / "architecture" / "index.html").read_text() for w in words[:2])


def test_a_broken_link_fails_the_build(tmp_path, caplog):
    """The strict build is only a check if a broken link does fail it."""
    (tmp_path / "docs").mkdir()
    for page in (ROOT / "docs").iterdir():
        if page.is_file():
            (tmp_path / "docs" / page.name).write_text(page.read_text())
    (tmp_path / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    with (tmp_path / "docs" / "gpus.md").open("a") as f:
        f.write("\n[a tutorial that does not exist](../tutorials/99_missing.py)\n")
    from mkdocs.exceptions import Abort

    with pytest.raises(Abort):
        build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert any("99_missing.py" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_architecture_names_every_module_and_only_modules_that_exist():
    """ARCHITECTURE.md (the guide's architecture page) lists each module by its path under
    graphtrainer/; a module added or moved without it, or a name left behind, fails here."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    package = ROOT / "graphtrainer"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert sorted(m for m in modules if f"`{m}`" not in text) == []
    named = set(re.findall(r"`([\w/]+\.py)`", text))
    repo_files = {n for n in named if (ROOT / n).is_file()}  # e.g. tests/unit/test_layers.py
    assert sorted(named - modules - repo_files - {"__init__.py"}) == []


def test_files_the_guide_names_exist():
    """Paths the guide names in code spans (``tests/integration/test_faults.py``, ``graphtrainer/...``,
    ``tutorials/...``, ``benchmarks/...``) still exist: files move when the code is reorganised."""
    missing = []
    for page in PAGES:
        for path in re.findall(r"`((?:tests|graphtrainer|tutorials|benchmarks|scripts|requirements)/[\w./-]+)`",
                               page.read_text()):
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{page.name}: {path}")
    assert missing == []


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?![a-z]+:|#)([^)#\s]+)", text)
    assert targets, "README.md should link into docs/"
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_every_python_block_is_run_or_taken_from_a_tested_file():
    assert len(BLOCKS) >= 8
    assert any(b.page.name == "README.md" and b.kind == "program" for b in BLOCKS)
    tests_text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name)
    for block in (b for b in BLOCKS if b.kind == "from"):
        source = ROOT / block.source
        assert source.is_file(), f"{block.name}: from {block.source}: no such file"
        module = block.source[:-3].replace("/", ".")
        assert source.name in tests_text or source.stem in tests_text or module in tests_text, \
            f"{block.name}: no test runs {block.source}"
        assert is_excerpt(block.code, source.read_text()), \
            f"{block.name}: the block is not a part of {block.source} as it is today"
    for block in (b for b in BLOCKS if b.kind == "program"):
        assert "if __name__ == \"__main__\":" in block.code, \
            f"{block.name}: a complete program needs its entry point (spawn and forkserver need it too)"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "quick"], ids=lambda b: b.name)
def test_quick_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, block.name, "exec"), {"__name__": "__main__"})


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "program"], ids=lambda b: b.name)
def test_program_block_runs(block, tmp_path):
    """Each complete program trains for one epoch on 2 ranks and exits cleanly."""
    proc = run_block(block, tmp_path, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
