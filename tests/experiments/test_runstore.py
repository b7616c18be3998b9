"""experiments.runstore: finished runs committed so a rerun longer than one session keeps its work."""
import json
import os

import pytest

from experiments import runstore
from fedpriv.data.errors import ConfigError
from fedpriv.recipes import public

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _run(key, acc=0.1, **kw):
    return {"run_key": key, "row": "none", "seed": 0, "arch": "lstm", "target_epsilon": 1.77,
            "test_accuracy": acc, "git_commit": COMMIT[:7], "git_commit_full": COMMIT,
            "git_dirty": False, "git_dirty_paths": [], **kw}


def _write(path, summary):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(summary, f)


def _workdir(tmp_path, runs):
    wd = tmp_path / "wd"
    _write(wd / "summary.json", {"module": "experiments.public_training"})  # the experiment's own: no key
    for i, s in enumerate(runs):
        _write(wd / f"seed0/eps1.77/row{i}/summary.json", s)
    return str(wd)


def _files(store):
    return sorted(os.path.relpath(os.path.join(d, f), store) for d, _, fs in os.walk(store) for f in fs)


def test_added_runs_are_read_back_by_key_and_adding_twice_changes_nothing(tmp_path):
    store = str(tmp_path / "store")
    wd = _workdir(tmp_path, [_run("a" * 16), _run("b" * 16, row="mid_dm", seed=2),
                             _run("c" * 16, reused_from="/elsewhere")])
    assert runstore.add(wd, store) == {"added": 2, "already": 0, "read_back": 1, "not_runs": 1,
                                       "superseded": 0, "moved": {}}
    # what run_rows' reuse_workdir search finds: the stored copy, with every field kept
    found = public._find_run("b" * 16, [store])
    assert found and found.startswith(store)
    with open(found) as f:
        assert json.load(f) == _run("b" * 16, row="mid_dm", seed=2)
    assert public._find_run("c" * 16, [store]) is None  # read-backs are not stored again
    before = _files(store)
    assert runstore.add(wd, store)["already"] == 2
    assert _files(store) == before
    assert any("seed2-mid_dm" in line and "10.00 %" in line for line in runstore.listing(store))


@pytest.mark.parametrize("bad, message", [
    (_run("d" * 16, git_dirty=True, git_dirty_paths=["fedpriv/fl/loop.py"]), "uncommitted changes"),
    (_run("d" * 16, git_dirty=None), "uncommitted changes"),  # unknown: refused too (fail closed)
    (_run("d" * 16, git_commit_full=""), "commit"),
    (_run("d" * 16, git_dirty=True, git_dirty_paths=["experiments/results/x.json", "fedpriv/fl/loop.py"]),
     "uncommitted changes"),  # outputs and code: refused
    (_run("d" * 16, git_dirty=True, git_dirty_paths=[f"experiments/results/{i}.json" for i in range(50)]),
     "uncommitted changes"),  # a list of 50 may be truncated: not trusted
])
def test_a_run_without_a_clean_commit_is_refused_and_nothing_is_written(tmp_path, bad, message):
    store = str(tmp_path / "store")
    wd = _workdir(tmp_path, [_run("a" * 16), bad])
    with pytest.raises(ConfigError, match=message):
        runstore.add(wd, store)
    assert not os.path.exists(store)  # all or nothing: the good run was not written either


def test_one_key_with_two_results_is_refused(tmp_path):
    store = str(tmp_path / "store")
    runstore.add(_workdir(tmp_path, [_run("a" * 16, acc=0.1)]), store)
    before = _files(store)
    other = tmp_path / "other"
    _write(other / "x/summary.json", _run("a" * 16, acc=0.2))
    with pytest.raises(ConfigError, match="two results"):
        runstore.add(str(other), store)
    assert _files(store) == before
    two = tmp_path / "two"  # the conflict inside one workdir is refused as well
    _write(two / "x/summary.json", _run("e" * 16, acc=0.1))
    _write(two / "y/summary.json", _run("e" * 16, acc=0.3))
    with pytest.raises(ConfigError, match="two results"):
        runstore.add(str(two), store)


def test_cli_refuses_a_missing_workdir_in_one_line(tmp_path, capsys):
    from experiments import common
    with pytest.raises(SystemExit) as e:
        common.cli(runstore.main, ["add", str(tmp_path / "nope"), "--name", "x", "--store", str(tmp_path / "s")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a directory" in err[0]
    assert not os.path.exists(tmp_path / "s")


def test_a_run_whose_tree_changed_only_published_outputs_is_stored(tmp_path):
    """A small run publishes into its checkout (experiments/results/): a later run there records
    a dirty tree, but its code is the commit's."""
    store = str(tmp_path / "store")
    run = _run("f" * 16, git_dirty=True, git_dirty_paths=["experiments/results/summaries/public_training.json",
                                                          "experiments/results/wang-table2-public_training.png"])
    assert runstore.add(_workdir(tmp_path, [run]), store)["added"] == 1


def test_a_run_whose_tree_changed_only_code_it_never_imports_is_stored(tmp_path):
    """A dirty tree whose changed files are Python modules that the store's experiments never
    import (another experiment's config and page code) ran its commit's code: stored. One file
    they do import (the recipe, the experiment module) is refused, as is a non-Python file."""
    loaded = runstore._loaded_files()
    assert "fedpriv/recipes/public.py" in loaded and "experiments/public_training.py" in loaded
    assert "experiments/page.py" not in loaded and "configs/iw_regime.py" not in loaded
    store = str(tmp_path / "store")
    run = _run("e" * 16, git_dirty=True, git_dirty_paths=["configs/iw_regime.py", "experiments/page.py"])
    assert runstore.add(_workdir(tmp_path, [run]), store)["added"] == 1
    for dirty in (["configs/iw_regime.py", "fedpriv/recipes/public.py"], ["docs/x.md"]):
        bad = _run("c" * 16, git_dirty=True, git_dirty_paths=dirty)
        with pytest.raises(ConfigError, match="uncommitted changes"):
            runstore.add(_workdir(tmp_path / dirty[-1].replace("/", "_"), [bad]), str(tmp_path / "s2"))


def _git_repo(tmp_path):
    """A throwaway repository with three commits: (repo, [first, second, third])."""
    import subprocess
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True)
    run("init", "-q")
    commits = []
    for i in range(3):
        (repo / "f").write_text(str(i))
        run("add", "f")
        run("commit", "-q", "-m", str(i))
        commits.append(run("rev-parse", "HEAD").stdout.strip())
    return str(repo), commits


def _at(key, commit, **kw):
    return _run(key, git_commit=commit[:7], git_commit_full=commit, **kw)


def test_supersede_replaces_a_run_only_by_its_rerun_at_a_descendant_commit(tmp_path):
    repo, (c0, c1, c2) = _git_repo(tmp_path)
    store = str(tmp_path / "store")
    runstore.add(_workdir(tmp_path, [_at("a" * 16, c1, test_loss=2.0), _at("b" * 16, c1, test_loss=3.0)]),
                 store, repo=repo)
    before = _files(store)

    def rerun(name, runs):
        wd = tmp_path / name
        for i, s in enumerate(runs):
            _write(wd / f"r{i}/summary.json", s)
        return str(wd)

    newer = rerun("newer", [_at("a" * 16, c2, test_loss=2.0), _at("b" * 16, c2, test_loss=3.5)])
    with pytest.raises(ConfigError, match="two results"):  # without --supersede: refused as before
        runstore.add(newer, store, repo=repo)
    for bad, why in ((rerun("older", [_at("a" * 16, c0, test_loss=2.0)]), "older commit"),
                     (rerun("same", [_at("a" * 16, c1, test_loss=2.5)]), "older commit"),
                     (rerun("unknown", [_at("a" * 16, "f" * 40, test_loss=2.0)]), "older commit"),
                     # a good rerun beside a refused one: nothing is written (all or nothing)
                     (rerun("mixed", [_at("b" * 16, c2, test_loss=3.5), _at("a" * 16, c0, test_loss=2.0)]),
                      "older commit")):
        with pytest.raises(ConfigError, match=why):
            runstore.add(bad, store, supersede=True, repo=repo)
        assert _files(store) == before
    counts = runstore.add(newer, store, supersede=True, repo=repo)
    assert (counts["superseded"], counts["added"]) == (2, 0)
    assert _files(store) == before  # replaced in place, under the same entry names
    assert counts["moved"] == {"a" * 16: {"test_accuracy": 0.0, "test_loss": 0.0},
                               "b" * 16: {"test_accuracy": 0.0, "test_loss": 0.5}}
    with open(runstore.stored(store)["b" * 16]) as f:
        assert json.load(f)["git_commit_full"] == c2
    line = runstore.moved_summary(counts["moved"])
    assert line.startswith("2 superseded: ") and "test_accuracy identical in 2, largest change 0 points" in line
    assert "test_loss identical in 1, largest change 0.5" in line
    assert runstore.add(newer, store, supersede=True, repo=repo)["already"] == 2  # idempotent


def test_view_links_only_the_runs_at_or_after_a_commit_for_a_rerun_to_read_back(tmp_path):
    repo, (c0, c1, c2) = _git_repo(tmp_path)
    store = str(tmp_path / "store")
    runstore.add(_workdir(tmp_path, [_at("a" * 16, c0), _at("b" * 16, c1), _at("c" * 16, c2)]), store, repo=repo)
    out = str(tmp_path / "fresh")
    assert runstore.view(out, store, c1, repo=repo) == {"linked": 2, "left_out": 1}
    # a rerun reading back from the view finds the fresh runs and retrains the old one
    assert public._find_run("b" * 16, [out]) and public._find_run("c" * 16, [out])
    assert public._find_run("a" * 16, [out]) is None
    with pytest.raises(ConfigError, match="exists already"):
        runstore.view(out, store, c1, repo=repo)
    with pytest.raises(ConfigError, match="not a commit"):
        runstore.view(str(tmp_path / "other"), store, "f" * 40, repo=repo)
    assert not os.path.exists(tmp_path / "other")
