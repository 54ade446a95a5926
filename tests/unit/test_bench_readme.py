"""benchmarks/README.md's results table is generated from benchmarks/results/ (the newest file of
each benchmark by its recorded date): it cannot go stale, and the generator picks the newest run."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness", ROOT / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_matches_the_results_on_disk():
    harness = _harness()
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert harness.render_readme(text) == text, "stale: run python benchmarks/harness.py report"
    table = text.split(harness.BEGIN)[1].split(harness.END)[0]
    for name in ("overhead", "tutorial_vs_task", "distgraph", "gpu", "small_collectives"):
        assert f"| {name} |" in table
    assert "not summarised" not in table


def test_the_newest_file_by_date_is_the_one_shown(tmp_path):
    harness = _harness()
    for folder, date, ratio in (("old", "2026-01-01T00:00:00+00:00", 1.5), ("new", "2026-02-01T00:00:00+00:00", 0.99),
                                ("z-undated", None, 2.0)):
        (tmp_path / folder).mkdir()
        payload = {"targets": [{"graph": "tolokers", "measured": ratio}]}
        if date:
            payload["date"] = date
        (tmp_path / folder / "overhead.json").write_text(json.dumps(payload))
    table = harness.results_table(tmp_path)
    assert "graphtrainer / hand-written 0.990x" in table and "results/new/overhead.json" in table
    readme = f"intro\n{harness.BEGIN}\nold table\n{harness.END}\ntail\n"
    assert harness.render_readme(readme, tmp_path) == f"intro\n{harness.BEGIN}\n{table}\n{harness.END}\ntail\n"
