"""The results page: regenerated from runs/, showing each artefact's command, verdicts, tables and
figures; a failed run records nothing; verdicts say what was measured."""
import json
import os

import pytest

from experiments import __main__ as index
from experiments import common, latency_figure, results
from fedpriv.report import Verdict, ordering_verdict, read_verdicts, write_verdicts


def test_ordering_verdict_directions_and_noise():
    v = ordering_verdict("a beats b", [10.0, 11.0, 12.0], [5.0, 6.0, 7.0], higher_is_better=True)
    assert v.status == "reproduced" and "gap +5" in v.measured
    v = ordering_verdict("a beats b", [10.0, 11.0, 12.0], [5.0, 6.0, 7.0], higher_is_better=False)
    assert v.status == "not reproduced"
    # a gap smaller than the seed spread is flagged, whichever way it points
    v = ordering_verdict("a beats b", [1.0, 3.0], [1.5, 2.0], higher_is_better=True)
    assert v.status == "reproduced (within noise)"
    with pytest.raises(ValueError, match="verdict status"):
        Verdict("claim", "probably", "")
    with pytest.raises(ValueError, match="no finite values"):
        ordering_verdict("c", [], [1.0], higher_is_better=True)


def test_results_page_shows_a_finished_run_and_names_the_rest(tmp_path):
    runs = tmp_path / "runs"
    wd = runs / "latency_figure"
    common.cli(latency_figure.main, ["--config", "configs/latency_figure.py:smoke", "--workdir", str(wd)])
    inv = json.loads((wd / common.INVOCATION_FILE).read_text())
    assert inv["module"] == "experiments.latency_figure"
    assert inv["config"] == "configs/latency_figure.py:smoke"
    assert {v.status for v in read_verdicts(str(wd))} == {"reproduced"}
    # a later failed run (bad override) leaves the record of the good one alone
    with pytest.raises(SystemExit):
        common.cli(latency_figure.main, ["--config", "configs/latency_figure.py:smoke,trials=0",
                                         "--workdir", str(wd)])
    assert json.loads((wd / common.INVOCATION_FILE).read_text()) == inv

    out = tmp_path / "page" / "RESULTS.md"
    common.cli(results.main, ["--runs", str(runs), "--out", str(out)])
    page = out.read_text()
    section = page.split("## koga-figure1")[1].split("\n## ")[0]
    assert "python -m experiments.latency_figure --config configs/latency_figure.py:smoke" in section
    assert "| a larger population lowers the latency" in section and "**reproduced**" in section
    assert "Monte Carlo vs exact vs bounds" in section  # the inlined table
    assert "![koga-figure1: latency.png](results/koga-figure1-latency.png)" in section
    assert (out.parent / "results" / "koga-figure1-latency.png").stat().st_size > 1000
    for a in index.ARTEFACTS:
        assert f"## {a.name} " in page
        body = page.split(f"## {a.name} ")[1].split("\n## ")[0]
        if not index.available(a):
            assert "NOT YET IMPLEMENTED" in body
        elif a.module != "latency_figure":
            assert "Not run yet" in body and f"python -m experiments.{a.module}" in body


def test_results_refuses_a_missing_runs_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        common.cli(results.main, ["--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "R.md")])
    assert e.value.code == 2 and "not a directory" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "R.md")


def test_verdicts_round_trip(tmp_path):
    vs = [Verdict("x", "not reproduced (within noise)", "1 vs 2")]
    write_verdicts(vs, str(tmp_path))
    assert read_verdicts(str(tmp_path)) == vs
    assert read_verdicts(str(tmp_path / "none")) == []


def test_artefacts_sharing_a_run_show_their_own_claims(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    wd = runs / "shared"
    wd.mkdir(parents=True)
    (wd / common.INVOCATION_FILE).write_text(json.dumps(
        {"module": "experiments.shared", "config": "configs/shared.py:small",
         "command": "python -m experiments.shared --config configs/shared.py:small", "time": "t"}))
    write_verdicts([Verdict("A wins (Table 1)", "reproduced", "1 vs 0"),
                    Verdict("B wins (Figure 1)", "not reproduced (within noise)", "0 vs 0.1")], str(wd))
    arts = (index.Artefact("t1", "P", "table", "shared", "demo", claims=("(Table 1)",)),
            index.Artefact("f1", "P", "figure", "shared", "demo", claims=("(Figure 1)",)))
    monkeypatch.setattr(results, "ARTEFACTS", arts)
    page = results.build(str(runs), str(tmp_path / "R.md"))
    t1, f1 = page.split("## t1 ")[1].split("\n## ")[0], page.split("## f1 ")[1]
    assert "A wins" in t1 and "B wins" not in t1
    assert "B wins" in f1 and "A wins" not in f1
    assert "| t1 | P | `configs/shared.py:small` | 1 reproduced |" in page
    assert "| f1 | P | `configs/shared.py:small` | 1 not reproduced within noise |" in page
