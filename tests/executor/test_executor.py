"""fedpriv.executor: tasks run in pinned worker processes, nothing is dropped silently (issue 51)."""
from __future__ import annotations

import os

import pytest

from fedpriv.executor import ExecutorError, Task, resolve_workers, run_tasks
from tests.conftest import ALL_CPUS

T = "tests.executor.targets"
CORES = list(ALL_CPUS)  # the cores the suite may use (each xdist worker is pinned to one)


def test_tasks_run_pinned_one_core_each(tmp_path):
    tasks = [Task(f"t{i}", f"{T}:affinity", {"tag": f"v{i}"}) for i in range(3)]
    res = run_tasks(tasks, workers=min(2, len(CORES)), log_dir=str(tmp_path / "logs"), progress=False)
    assert [r.key for r in res] == ["t0", "t1", "t2"]  # results in task order
    assert all(r.status == "done" and r.attempts == 1 for r in res)
    assert [r.value["tag"] for r in res] == ["v0", "v1", "v2"]
    for r in res:  # each worker pinned to exactly one of this process's cores
        assert len(r.value["cores"]) == 1 and r.value["cores"][0] in CORES
        assert os.path.exists(r.log)
    assert len({r.value["pid"] for r in res}) == 3  # one process per task


def test_dead_worker_is_retried_and_reported(tmp_path):
    marker = str(tmp_path / "marker")
    res = run_tasks([Task("dies", f"{T}:die_once", {"marker": marker})], workers=1,
                    log_dir=str(tmp_path / "logs"), progress=False)
    assert res[0].status == "done" and res[0].attempts == 2 and res[0].value == "second attempt"
    assert "attempt 2" in open(res[0].log).read()
    # no retries left: the death is reported, not dropped
    os.remove(marker)
    with pytest.raises(ExecutorError, match=r"dies \(exit -9 after 1 attempt"):
        run_tasks([Task("dies", f"{T}:die_once", {"marker": marker})], workers=1, retries=0,
                  log_dir=str(tmp_path / "logs2"), progress=False)


def test_failures_named_after_the_others_finish(tmp_path):
    marker = str(tmp_path / "attempts")
    tasks = [Task("bad", f"{T}:bad_input", {"name": "x"}), Task("bug", f"{T}:crash", {"marker": marker}),
             Task("fine", f"{T}:write", {"path": str(tmp_path / "out" / "f.txt"), "text": "hello"})]
    with pytest.raises(ExecutorError) as e:
        run_tasks(tasks, workers=1, retries=1, log_dir=str(tmp_path / "logs"), progress=False)
    msg = str(e.value)
    assert "2 of 3 tasks failed" in msg and "bad (exit 2 after 1 attempt" in msg  # bad input: not retried
    assert "bug (exit 1 after 2 attempt" in msg and open(marker).read() == "xx"  # a crash: retried once
    assert open(tmp_path / "out" / "f.txt").read() == "hello"  # the good task still ran
    assert "bad input 'x'" in open(tmp_path / "logs" / "bad.log").read()


@pytest.mark.parametrize("kwargs, match", [
    (dict(tasks=[Task("a", f"{T}:write"), Task("a", f"{T}:write")]), "repeated: a"),
    (dict(workers="two"), "workers = 'two'"),
    (dict(workers=0), "workers = 0"),
    (dict(workers=len(CORES) + 1), "needs"),
    (dict(retries=-1), "retries"),
    (dict(backend="slurm"), "backend 'slurm'"),
])
def test_bad_settings_refused(tmp_path, kwargs, match):
    kwargs = {"tasks": [Task("a", f"{T}:write", {"path": str(tmp_path / "x"), "text": ""})], **kwargs}
    with pytest.raises(ExecutorError, match=match):
        run_tasks(log_dir=str(tmp_path), progress=False, **kwargs)


@pytest.mark.parametrize("key, target, kwargs", [("../up", f"{T}:write", {}), ("a b", f"{T}:write", {}),
                                                 ("k", "no_colon", {}), ("k", f"{T}:write", {"x": object()})])
def test_bad_tasks_refused(key, target, kwargs):
    with pytest.raises(ExecutorError):
        Task(key, target, kwargs)


def test_resolve_workers():
    assert resolve_workers("auto", 1) == len(CORES)
    assert resolve_workers("auto", 1, n_tasks=1) == 1
    assert resolve_workers(1, 1) == 1
