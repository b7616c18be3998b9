"""An experiment's runs through fedpriv.executor: the same numbers for any worker count (issue 51)."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil

import numpy as np
import pytest

from experiments import common, mf_comparison

NUMBERS = ("epsilon", "epsilon_executed_run", "noise_multiplier", "val_accuracy", "test_accuracy",
           "val_loss", "test_loss")
CONFIG = "configs/mf_comparison.py:smoke,seeds=0/1,algorithms=dp_ftrl"


def _runs(workdir) -> dict:
    """{run folder: its summary's numbers} of every run under ``workdir``."""
    out = {}
    for path in glob.glob(os.path.join(workdir, "seed*", "summary.json")):
        s = json.load(open(path))
        out[os.path.basename(os.path.dirname(path))] = {k: s[k] for k in NUMBERS}
    return out


@pytest.fixture(scope="module")
def by_workers(tmp_path_factory):
    out = {}
    for workers in ("0", "1", "2"):
        wd = str(tmp_path_factory.mktemp(f"w{workers}"))
        common.cli(mf_comparison.main, ["--config", CONFIG, "--workdir", wd, "--workers", workers, "--no-publish"])
        out[workers] = wd
    return out


def test_same_numbers_for_any_worker_count(by_workers):
    one, two = _runs(by_workers["1"]), _runs(by_workers["2"])
    assert sorted(one) == ["seed0-dp_ftrl", "seed1-dp_ftrl"]
    assert one == two  # every task pinned to one core either way: bit for bit
    logs = sorted(os.listdir(os.path.join(by_workers["2"], "_executor")))
    assert logs == ["seeds=0,algorithms=dp_ftrl.log", "seeds=1,algorithms=dp_ftrl.log"]
    # the table the experiment publishes is the same too
    table = [json.load(open(os.path.join(by_workers[w], "summary.json")))["rows"] for w in "12"]
    assert [{k: r[k] for k in ("algorithm", "seed", "val_accuracy", "test_accuracy")} for r in table[0]] == \
           [{k: r[k] for k in ("algorithm", "seed", "val_accuracy", "test_accuracy")} for r in table[1]]


def test_in_process_runs_agree_up_to_float_order(by_workers):
    inline, pooled = _runs(by_workers["0"]), _runs(by_workers["1"])
    assert not os.path.exists(os.path.join(by_workers["0"], "_executor"))  # --workers 0: no workers
    assert sorted(inline) == sorted(pooled)
    for run, nums in inline.items():  # XLA's thread count may move the last digits only
        for k in NUMBERS:
            if nums[k] is None or pooled[run][k] is None:
                assert nums[k] is pooled[run][k], f"{run} {k}"
            else:
                np.testing.assert_allclose(nums[k], pooled[run][k], rtol=1e-4, err_msg=f"{run} {k}")


def test_parts_and_narrowing():
    cfg = common.load_config(CONFIG)
    parts = common.product(cfg, "seeds", "algorithms")
    assert parts == [{"seeds": 0, "algorithms": "dp_ftrl"}, {"seeds": 1, "algorithms": "dp_ftrl"}]
    narrow = common.narrowed(cfg, parts[1])
    assert narrow.seeds == (1,) and narrow.algorithms == ("dp_ftrl",) and narrow.lm == cfg.lm

    @dataclasses.dataclass(frozen=True)
    class Inner:
        seeds: tuple = (0, 1, 2)

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = Inner()
        epsilons: tuple = (1.0, 8.0)

    outer = Outer()
    assert common.product(outer, "inner.seeds", "epsilons")[-1] == {"inner.seeds": 2, "epsilons": 8.0}
    assert common.narrowed(outer, {"inner.seeds": 2, "epsilons": 8.0}) == Outer(Inner((2,)), (8.0,))


# ------------------------------------------------------------------ the cluster backend (Ray)

@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from fedpriv.executor import cluster
    cluster.connect("local", num_cpus=2)
    yield ray
    ray.shutdown()


def test_cluster_runs_the_experiment(ray_local, by_workers, tmp_path):
    wd = str(tmp_path / "ray")
    common.cli(mf_comparison.main, ["--config", CONFIG, "--workdir", wd, "--cluster", "local", "--workers", "auto",
                                       "--no-publish"])
    on_ray, local = _runs(wd), _runs(by_workers["1"])
    assert sorted(on_ray) == sorted(local)
    for run, nums in on_ray.items():  # Ray does not pin cores: equal up to float order
        for k in NUMBERS:
            if nums[k] is None:
                assert local[run][k] is None
            else:
                np.testing.assert_allclose(nums[k], local[run][k], rtol=1e-4, err_msg=f"{run} {k}")
    assert sorted(os.listdir(os.path.join(wd, "_executor")))[-2:] == ["seeds=0,algorithms=dp_ftrl.log",
                                                                       "seeds=1,algorithms=dp_ftrl.log"]


def test_cluster_writes_back_without_a_shared_filesystem(ray_local, tmp_path):
    """A node that does not see the driver's files runs in a scratch tree and returns what the
    task wrote under its outputs; the driver writes it into its own tree."""
    from fedpriv.executor import ExecutorError, Task, cluster
    out = os.path.join("runs", f".test-ray-{os.getpid()}")  # relative: mapped into the node's scratch tree
    try:
        tasks = [Task(f"t{i}", "tests.executor.targets:write_where", {"path": f"{out}/t{i}/summary.json",
                                                                "text": json.dumps({"run_key": f"k{i}"})},
                      outputs=out) for i in range(2)]
        res = cluster.run_on_ray(tasks, workers="auto", cores_per_worker=1, retries=0,
                                 log_dir=str(tmp_path / "logs"), address=None, progress=False, shared_fs=False)
        assert [r.status for r in res] == ["done", "done"]
        for r in res:  # written in the node's scratch tree, not in place ...
            assert not r.value.startswith(os.getcwd() + os.sep)
        # ... and written back into the driver's tree
        assert json.load(open(f"{out}/t1/summary.json")) == {"run_key": "k1"}
        # a finished run holding another key is never replaced by a returned file
        with pytest.raises(ExecutorError, match="holds run key k0"):
            cluster._write_back(out, {"t0/summary.json": json.dumps({"run_key": "other"}).encode()})
        # a task that dies is reported after its retries, as locally
        marker = str(tmp_path / "marker")
        res = cluster.run_on_ray([Task("dies", "tests.executor.targets:die_once", {"marker": marker})],
                                 workers=1, cores_per_worker=1, retries=1, log_dir=str(tmp_path / "logs2"),
                                 address=None, progress=False)
        assert res[0].status == "done" and res[0].attempts == 2
    finally:
        shutil.rmtree(out, ignore_errors=True)
