"""The results page: regenerated from runs/ or, where runs/ lacks an artefact, from its committed
compact summary; each artefact's command, commit (how old, STALE when its library code changed
since), verdicts, tables and figures; --json lists every verdict with its numbers; a failed run
records nothing; a page is never rewritten so that it loses results it shows."""
import json
import os
import subprocess

import pytest

from experiments import common, compact as compact_mod, index, latency_figure, results
from fedpriv import verdicts as V
from fedpriv.report import Verdict, read_verdicts, write_verdicts


def test_results_page_shows_a_finished_run_and_names_the_rest(tmp_path):
    runs = tmp_path / "runs"
    wd = runs / "latency_figure"
    common.cli(latency_figure.main, ["--config", "configs/latency_figure.py:smoke", "--workdir", str(wd)])
    inv = json.loads((wd / common.INVOCATION_FILE).read_text())
    assert inv["module"] == "experiments.latency_figure"
    assert inv["config"] == "configs/latency_figure.py:smoke"
    # what it cost and the library code it ran (the page's staleness reads code_paths)
    assert inv["wall_clock_s"] > 0 and inv["cpu_s"] > 0
    assert "fedpriv/report.py" in inv["code_paths"] and all(p.startswith("fedpriv/") for p in inv["code_paths"])
    assert {v.status for v in read_verdicts(str(wd))} == {"reproduced"}
    # a later failed run (bad override) leaves the record of the good one alone
    with pytest.raises(SystemExit):
        common.cli(latency_figure.main, ["--config", "configs/latency_figure.py:smoke,trials=0",
                                         "--workdir", str(wd)])
    assert json.loads((wd / common.INVOCATION_FILE).read_text()) == inv

    # the run's compact summary: commit, verdicts with their numbers, the inlined tables; a smoke
    # run never publishes it into the repository
    compact = json.loads((wd / results.COMPACT_FILE).read_text())
    assert compact["git_commit_full"] == inv["git_commit_full"] and len(compact["git_commit_full"]) == 40
    assert isinstance(compact["git_dirty"], bool) and compact["artefacts"] == ["koga-figure1"]
    assert "Monte Carlo vs exact vs bounds" in compact["outputs"]["latency.md"]
    assert compact["figures"] == ["latency.png"]
    assert not os.path.exists(os.path.join(compact_mod.SUMMARY_DIR, "latency_figure.json")) or \
        json.load(open(os.path.join(compact_mod.SUMMARY_DIR, "latency_figure.json")))["config"] != inv["config"]

    out = tmp_path / "page" / "RESULTS.md"
    common.cli(results.main, ["--runs", str(runs), "--out", str(out), "--summaries", str(tmp_path / "none")])
    page = out.read_text()
    section = page.split("## koga-figure1")[1].split("\n## ")[0]
    assert "python -m experiments.latency_figure --config configs/latency_figure.py:smoke" in section
    assert "| a larger population lowers the latency" in section and "**reproduced**" in section
    assert f"ran at commit {inv['git_commit']}" in section and "commits before HEAD" not in section
    # the Regenerate line is the command the outputs were recorded with
    assert f"Regenerate: `{inv['command']}`" in section
    assert "Monte Carlo vs exact vs bounds" in section  # the inlined table
    assert "![koga-figure1: latency](results/koga-figure1-latency.png)" in section
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
        common.cli(results.main, ["--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "R.md"),
                                  "--summaries", str(tmp_path / "none")])
    assert e.value.code == 2 and "not a directory" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "R.md")


def test_verdicts_round_trip(tmp_path):
    vs = [Verdict("x", "inconclusive (interval contains 0)", "1 vs 2")]
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
                    Verdict("B wins (Figure 1)", "inconclusive (interval contains 0)", "0 vs 0.1")], str(wd))
    arts = (index.Artefact("t1", "P", "table", "shared", "demo", claims=("(Table 1)",)),
            index.Artefact("f1", "P", "figure", "shared", "demo", claims=("(Figure 1)",)))
    monkeypatch.setattr(index, "ARTEFACTS", arts)
    page = results.build(str(runs), str(tmp_path / "R.md"), summary_dir=str(tmp_path / "none"))
    t1, f1 = page.split("## t1 ")[1].split("\n## ")[0], page.split("## f1 ")[1]
    assert "A wins" in t1 and "B wins" not in t1
    assert "B wins" in f1 and "A wins" not in f1
    assert "| t1 | P | `configs/shared.py:small` | ? STALE | 1 reproduced |" in page
    assert ("| f1 | P | `configs/shared.py:small` | ? STALE | "
            "1 inconclusive (interval contains 0) |") in page
    assert "**STALE**: no commit recorded" in t1  # a run without a commit is never taken as current


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo, path, text, msg):
    p = repo / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", msg)
    return _git(repo, "rev-parse", "HEAD")


def _verdicts():
    return [V.compare("A beats B (Fig. 1)", {0: 10.0, 1: 11.0, 2: 12.5}, {0: 8.0, 1: 9.5, 2: 10.0},
                      higher_is_better=True, trivial=4.0, names=("A", "B")),
            V.compare("C beats B (Fig. 1)", {0: 3.0, 1: 3.5, 2: 3.2}, {0: 8.0, 1: 9.5, 2: 10.0},
                      higher_is_better=True, trivial=4.0, names=("C", "B")),
            V.not_testable("the 1% vs 100% contrast (Fig. 1)", "the pool is too small")]


def test_page_from_a_committed_compact_summary_with_staleness_and_json(tmp_path, monkeypatch, capsys):
    """runs/ is empty (as on a fresh checkout): the page comes from the committed summary, says
    which commit it ran at, how many commits old it is, and that it is STALE once fedpriv/
    changed; --json lists every verdict with its numbers, trivial baseline and commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    ran_at = _commit(repo, "fedpriv/core.py", "x = 1\n", "library")
    _commit(repo, "README.md", "docs\n", "docs only")
    arts = (index.Artefact("fig1", "P", "a figure", "latency_figure", "latency_figure",
                           outputs=("latency.md", "latency.png")),)
    monkeypatch.setattr(index, "ARTEFACTS", arts)
    deps = results.dependencies(arts[0], str(repo))
    assert deps == ["fedpriv", "configs/latency_figure.py", "experiments/latency_figure.py"]
    st = results.staleness(ran_at, deps, str(repo))
    assert (st["commits_behind"], st["stale"]) == (1, False)      # an unrelated commit: current
    assert results.staleness("f" * 40, deps, str(repo))["stale"]  # unknown commit: fail closed

    inv = {"module": "experiments.latency_figure", "config": "configs/latency_figure.py:small",
           "command": "python -m experiments.latency_figure --config configs/latency_figure.py:small",
           "time": "2026-11-25 07:00:00", "git_commit": ran_at[:7], "git_commit_full": ran_at,
           "git_dirty": False, "git_dirty_paths": []}
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "latency.md").write_text("# Latency table\n\n| N | E |\n|---|---|\n| 10 | 1.5 |\n")
    (wd / "latency.png").write_bytes(b"png" * 500)
    write_verdicts(_verdicts(), str(wd))
    summaries, figs = tmp_path / "summaries", tmp_path / "figs"
    figs.mkdir()
    # a smoke run publishes nothing; a small run publishes its summary and figures
    results.record_compact({**inv, "config": "configs/latency_figure.py:smoke"}, str(wd), str(summaries), str(figs))
    assert not summaries.exists() and (wd / results.COMPACT_FILE).exists()
    results.record_compact(inv, str(wd), str(summaries), str(figs))
    assert (summaries / "latency_figure.json").exists() and (figs / "fig1-latency.png").exists()

    out_dir = tmp_path / "page"
    (out_dir / "results").mkdir(parents=True)
    (out_dir / "results" / "fig1-latency.png").write_bytes(b"png" * 500)  # committed beside the page
    out = out_dir / "RESULTS.md"
    build = lambda **kw: results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(summaries),
                                       repo=str(repo), **kw)
    page = build()
    assert "read from its committed compact summary; ran at commit " + ran_at[:7] in page
    assert "commits old" not in page and "commits before HEAD" not in page  # ages go stale: --json only
    assert "STALE" not in page.split("## fig1")[1]
    assert "| A beats B (Fig. 1) | **reproduced** |" in page and "paired t" in page
    # C is below its trivial baseline and significantly worse than B, which is above it (issue 50)
    assert "| C beats B (Fig. 1) | **not reproduced** |" in page
    assert "| the 1% vs 100% contrast (Fig. 1) | **not testable here** | not testable here | the pool is too small |" \
        in page
    assert "#### Latency table" in page and "![fig1: latency](results/fig1-latency.png)" in page
    assert f"| fig1 | P | `configs/latency_figure.py:small` | {ran_at[:7]} |" in page

    # docstring / comment / layout edits are not code changes; a run's unimported modules don't count
    _commit(repo, "fedpriv/core.py", '"""The core."""\n# one\nx = (\n    1)\n', "document the library")
    assert not results.staleness(ran_at, deps, str(repo))["stale"]
    # import order and grouping are layout too; a new import is code
    assert results._code("import os\nimport re\nfrom a import (b, c)\n") == \
        results._code("from a import c\nfrom a import b\nimport re\nimport os\n")
    assert results._code("import os\n") != results._code("import os\nimport re\n")
    _commit(repo, "fedpriv/other.py", "y = 1\n", "a module the run never imported")
    st = results.staleness(ran_at, deps, str(repo), loaded=["fedpriv/core.py"])
    assert not st["stale"] and results.staleness(ran_at, deps, str(repo))["stale"]  # unknown imports: any
    _commit(repo, "fedpriv/corpus.txt", "words\n", "library data")
    assert results.staleness(ran_at, deps, str(repo), loaded=["fedpriv/core.py"])["changed_files"] == \
        ["fedpriv/corpus.txt"]                                            # data files always count
    _commit(repo, "fedpriv/core.py", "x = 2\n", "change the library")
    st = results.staleness(ran_at, deps, str(repo), loaded=["fedpriv/core.py"])
    assert st["stale"] and "fedpriv/core.py" in st["changed_files"]
    page = build()
    assert "**STALE**: the code of fedpriv/core.py, fedpriv/corpus.txt, fedpriv/other.py changed since " \
           "(newest: " in page
    assert f"{ran_at[:7]} STALE" in page

    rows = results.as_json(str(tmp_path / "empty_runs"), str(summaries), str(repo))
    assert [r["status"] for r in rows] == ["reproduced", "not reproduced", "not testable here"]
    assert [r["holm_status"] for r in rows] == ["reproduced", "not reproduced", "not testable here"]
    r = rows[0]
    assert r["commit"] == ran_at and r["commits_behind"] == 5 and r["stale"] is True
    assert r["sides"][0]["values"] == {"0": 10.0, "1": 11.0, "2": 12.5} and r["sides"][0]["trivial"] == 4.0
    assert r["method"] == "paired t" and r["ci"][0] > 0 and r["gap"] == pytest.approx(2.0, rel=1e-12)
    # the command line: --json prints it (and writes nothing)
    monkeypatch.setattr(results, "ROOT", str(repo))
    common.cli(results.main, ["--json", "--runs", str(tmp_path / "empty_runs"), "--summaries", str(summaries)])
    printed = json.loads(capsys.readouterr().out)
    assert [p["claim"] for p in printed] == [r["claim"] for r in rows]

    # the page is not rewritten from nothing: it would drop fig1's results
    before = out.read_text()
    with pytest.raises(common.ConfigError, match="fig1"):
        results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(tmp_path / "none"), repo=str(repo))
    assert out.read_text() == before
    page = results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(tmp_path / "none"),
                         repo=str(repo), force=True)
    assert "Not run yet" in page


def test_an_artefact_is_dated_by_the_commit_its_runs_trained_at(tmp_path, monkeypatch):
    """Tables written at a later commit from finished runs read back (e.g. seeds run apart, then
    combined) are dated by the oldest commit those runs recorded: a library change between the
    training and the tables makes the artefact STALE; without sub-runs, the invocation's commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    trained = _commit(repo, "fedpriv/core.py", "x = 1\n", "library")
    written = _commit(repo, "fedpriv/core.py", "x = 2\n", "change the library")
    arts = (index.Artefact("fig1", "P", "a figure", "latency_figure", "latency_figure",
                           outputs=("latency.md",)),)
    monkeypatch.setattr(index, "ARTEFACTS", arts)
    wd = tmp_path / "run"
    for seed, commit in ((0, trained), (1, written)):
        (wd / f"seed{seed}").mkdir(parents=True)
        (wd / f"seed{seed}" / "summary.json").write_text(json.dumps({"git_commit_full": commit}))
    (wd / "summary.json").write_text(json.dumps({"git_commit_full": written}))  # the invocation's own
    (wd / "latency.md").write_text("# Latency table\n")
    write_verdicts(_verdicts(), str(wd))
    assert results.trained_commits(str(wd)) == [trained, written]
    assert results.oldest_commit([written, trained], str(repo)) == trained
    inv = {"module": "experiments.latency_figure", "config": "configs/latency_figure.py:small",
           "command": "python -m experiments.latency_figure", "time": "2026-11-26 16:00:00",
           "git_commit": written[:7], "git_commit_full": written, "git_dirty": False}
    summaries = tmp_path / "summaries"
    s = results.record_compact(inv, str(wd), str(summaries), str(tmp_path))
    assert s["trained_at"] == [trained, written]
    out = tmp_path / "RESULTS.md"
    page = results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(summaries), repo=str(repo))
    assert f"trained at {trained[:7]}, {written[:7]}, tables written at {written[:7]}" in page
    assert f"| {trained[:7]} STALE |" in page
    # a run read back that recorded no commit: its code is unknown -> STALE (fail closed)
    (wd / "seed2").mkdir()
    (wd / "seed2" / "summary.json").write_text(json.dumps({"val_accuracy": 0.1}))
    assert results.trained_commits(str(wd)) == [trained, written, None]
    results.record_compact(inv, str(wd), str(summaries), str(tmp_path))
    page = results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(summaries), repo=str(repo))
    assert "**STALE**: a training run it read back recorded no commit" in page
    os.remove(wd / "seed2" / "summary.json")
    # runs combined from another workdir by symlink (pre_text's combine) are read through the
    # link: the page once dated such an artefact by the combine's own commit, as current
    other = tmp_path / "other_run"
    (other / "seed3").mkdir(parents=True)
    (other / "seed3" / "summary.json").write_text(json.dumps({"git_commit_full": trained}))
    os.symlink(other / "seed3", wd / "seed3")
    os.symlink(other, other / "seed3" / "loop")  # a link cycle is walked once
    for seed in (0, 1):
        os.remove(wd / f"seed{seed}" / "summary.json")
    assert results.trained_commits(str(wd)) == [trained]
    os.remove(wd / "seed3")
    # the same tables with no sub-runs: dated by the invocation, current
    results.record_compact(inv, str(wd), str(summaries), str(tmp_path))
    page = results.build(str(tmp_path / "empty_runs"), str(out), summary_dir=str(summaries), repo=str(repo),
                         force=True)
    assert f"| {written[:7]} |" in page


def test_dirty_tree_note_says_whether_code_was_uncommitted():
    """A run whose tree differed from its commit only by other artefacts' published summaries says
    so; any other uncommitted path (code) keeps the plain warning; unrecorded state is named."""
    from experiments.results import _dirty_note
    assert _dirty_note(False, []) == ""
    assert _dirty_note(None, None) == "; tree state not recorded"
    assert "no code" in _dirty_note(True, ["experiments/results/summaries/demo.json"])
    for paths in (["fedpriv/dp/noise.py"], ["experiments/results/summaries/demo.json", "configs/lm_fl.py"], [], None):
        assert _dirty_note(True, paths) == "; the tree had uncommitted changes"


def test_no_publish_keeps_a_small_run_out_of_the_repository(tmp_path, monkeypatch):
    """``--no-publish`` (make demo): a small run's compact summary stays in its workdir; without
    it the same run publishes (into a stand-in for experiments/results/)."""
    summaries, figs = tmp_path / "summaries", tmp_path / "figs"
    figs.mkdir()
    monkeypatch.setattr(compact_mod, "SUMMARY_DIR", str(summaries))
    monkeypatch.setattr(compact_mod, "RESULTS_DIR", str(figs))

    def main(argv):  # an experiment that writes nothing: what the CLI records is under test
        common.config_and_workdir(argv, "stand-in", "latency_figure")

    for flag, published in ((["--no-publish"], False), ([], True)):
        wd = tmp_path / f"run{len(flag)}"
        common.cli(main, ["--config", "configs/latency_figure.py:small", "--workdir", str(wd), *flag])
        assert (wd / results.COMPACT_FILE).exists()
        assert (summaries / "latency_figure.json").exists() == published, flag
    # the README's main job is that run with --no-publish: make demo leaves the checkout as it was
    with open(os.path.join(results.ROOT, "Makefile")) as f:
        demo = [line for line in f if "-m experiments.demo " in line]
    assert demo and all("--no-publish" in line for line in demo), demo
