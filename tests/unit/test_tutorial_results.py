"""The tutorials' results files (tutorials/results/): every tutorial has one, each names a
reference log that exists, and the check the smoke tests make catches a figure that moved
(tests/helpers/tutorial_results.py)."""
from __future__ import annotations

import json

import pytest

import tutorial_results
from tutorial_results import RESULTS, ROOT, check_figures

TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_every_tutorial_has_a_results_file_with_pinned_figures(tutorial):
    doc = json.loads((RESULTS / f"{tutorial}.json").read_text())
    smoke = doc["smoke"]
    assert smoke["figures"]["pinned"], "record them: the smoke test with GRAPHTRAINER_UPDATE_RESULTS=1"
    for stack, figures in smoke["figures"].items():
        assert set(figures) == set(smoke["tolerance"]), stack
        assert smoke["recorded_on"][stack]["stack"] == stack
    assert (ROOT / smoke["test"]).is_file()
    assert f'check_figures("{tutorial}"' in (ROOT / smoke["test"]).read_text()
    log = doc["reference"]["log"]
    assert log is None and doc["reference"]["note"] or (ROOT / log).is_file()


def test_docstrings_carry_no_pasted_logs():
    """An epoch line or a RESULT line in a tutorial's docstring is output: it goes to results/."""
    import ast

    for name in TUTORIALS:
        doc = ast.get_docstring(ast.parse((ROOT / "tutorials" / f"{name}.py").read_text())) or ""
        assert "RESULT {" not in doc and "epoch   0  train_loss" not in doc, name


def _results_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tutorial_results, "RESULTS", tmp_path)
    monkeypatch.setattr(tutorial_results, "ROOT", tmp_path)
    monkeypatch.setenv("GRAPHTRAINER_STACK", "pinned")
    monkeypatch.delenv(tutorial_results.UPDATE_VAR, raising=False)
    doc = {"smoke": {"tolerance": {"epochs": 0, "run.test_acc": 0.02},
                     "figures": {"pinned": {"epochs": 3, "run.test_acc": 0.80}}, "recorded_on": {}},
           "reference": {"log": "x.txt"}}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    return tmp_path / "t.json"


def test_a_figure_within_its_tolerance_passes(tmp_path, monkeypatch):
    _results_file(tmp_path, monkeypatch)
    assert check_figures("t", {"epochs": 3, "run": {"test_acc": 0.815}}) == {"epochs": 3, "run.test_acc": 0.815}


@pytest.mark.parametrize("summary, moved", [({"epochs": 3, "run": {"test_acc": 0.75}}, "run.test_acc"),
                                            ({"epochs": 4, "run": {"test_acc": 0.80}}, "epochs")])
def test_a_figure_that_moved_fails_naming_it(tmp_path, monkeypatch, summary, moved):
    _results_file(tmp_path, monkeypatch)
    with pytest.raises(AssertionError, match=rf"{moved}: recorded .* now .*GRAPHTRAINER_UPDATE_RESULTS=1"):
        check_figures("t", summary)


def test_update_mode_rewrites_this_sets_figures_only(tmp_path, monkeypatch):
    path = _results_file(tmp_path, monkeypatch)
    monkeypatch.setenv("GRAPHTRAINER_STACK", "newest")
    monkeypatch.setenv(tutorial_results.UPDATE_VAR, "1")
    with pytest.warns(UserWarning, match="rewrote the newest figures"):
        check_figures("t", {"epochs": 3, "run": {"test_acc": 0.7}})
    smoke = json.loads(path.read_text())["smoke"]
    assert smoke["figures"] == {"pinned": {"epochs": 3, "run.test_acc": 0.80},
                                "newest": {"epochs": 3, "run.test_acc": 0.7}}
    assert smoke["recorded_on"]["newest"]["stack"] == "newest"
