"""The cluster backend of :mod:`fedpriv.executor`: the same :class:`~fedpriv.executor.Task` list on a
Ray cluster (https://docs.ray.io), one task per GPU (or per ``cores_per_worker`` CPUs).

Why Ray: it is the engine ML groups already run their sweeps on (Ray Tune, RLlib), it schedules
by accelerator (``num_gpus=1`` gives a task one device and sets ``CUDA_VISIBLE_DEVICES``), it
starts on a laptop (``ray.init()``), a SLURM allocation, Kubernetes (KubeRay) or a cloud
autoscaler with the same driver code, and it ships the driver's code to the nodes
(``runtime_env={"working_dir": ...}``). Dask.distributed schedules GPUs only through manually
declared worker resources and has no code shipping of a working tree; submitit drives SLURM
alone. Each task runs exactly as a local worker does: ``python -m fedpriv.executor.worker`` in a
subprocess (a crash or out-of-memory kill costs that attempt only, and is retried).

**Outputs.** Where the nodes see the driver's filesystem (a local instance, or a shared mount at
the same path) a task writes its work directory in place and resumes from it. Otherwise it runs
in a scratch copy on its node and returns the files it wrote under its ``outputs`` directory;
the driver writes them into its own work directory, refusing to replace a finished run's
``summary.json`` that holds another run key (the run store's rule: one key, one set of
numbers). A task retried on such a cluster starts its runs again from round 0.

**Numbers.** On GPUs a task gets one device, as a local worker does. On CPU nodes Ray does not
pin cores, so XLA may give a task more threads than a pinned local worker has: its numbers then
equal the local executor's up to float summation order, not bit for bit.

Cluster recipe (every command) in docs/cluster.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from tqdm import tqdm

from fedpriv.executor.tasks import USER_ERROR_STATUS, ExecutorError, Task, TaskResult, _child_env, _say

# never shipped to the nodes (runtime_env working_dir): outputs, environments, history, the store
EXCLUDES = ["runs/", ".venv/", ".git/", "experiments/results/run_store/", "**/__pycache__/", ".gpu/"]


def _ray():
    try:
        import ray
    except ImportError as e:  # the extra is not installed
        raise ExecutorError("the cluster backend needs Ray: pip install 'ray>=2.40' (make setup installs it)") from e
    return ray


def connect(address: str | None, *, num_cpus: int | None = None, ship_code: bool | None = None):
    """Connect to (or start) Ray. ``address``: None or "local" starts a local instance (``num_cpus``
    of this machine); "auto" joins the cluster this machine is a node of; "ray://host:port" is a
    remote head (Ray Client). ``ship_code`` (default: for a remote ``ray://`` address) uploads
    the working tree (:data:`EXCLUDES` left out) to the nodes."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    local = address in (None, "local")
    ship = (str(address).startswith("ray://")) if ship_code is None else ship_code
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if ship:
        kwargs["runtime_env"] = {"working_dir": os.getcwd(), "excludes": EXCLUDES,
                                 "env_vars": {"PYTHONUNBUFFERED": "1"}}
    if local:
        kwargs.update(num_cpus=num_cpus or len(os.sched_getaffinity(0)), object_store_memory=200 * 2**20)
        ray.init(**kwargs)
    else:
        ray.init(address=address, **kwargs)
    return ray


def _collect(root: str, since: float) -> dict:
    """{path relative to ``root``: bytes} of the files under ``root`` modified at/after ``since``."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            try:
                if os.path.getmtime(path) >= since:
                    with open(path, "rb") as f:
                        out[os.path.relpath(path, root)] = f.read()
            except OSError:
                continue
    return out


def _scratch_tree(code_dir: str, scratch: str, outputs: str | None) -> str:
    """A directory in ``scratch`` that links every entry of ``code_dir`` (the shipped working
    tree) except the first component of ``outputs``, so the task writes its outputs afresh there."""
    if outputs and os.path.isabs(outputs):
        raise ExecutorError(f"outputs {outputs!r}: a relative path is needed on a cluster without a shared filesystem")
    top = os.path.normpath(outputs).split(os.sep)[0] if outputs else None
    tree = os.path.join(scratch, "tree")
    os.makedirs(tree)
    for name in os.listdir(code_dir):
        if name != top:
            os.symlink(os.path.join(code_dir, name), os.path.join(tree, name))
    return tree


def execute(task: dict, cwd: str, token: str, env: dict) -> dict:
    """In a Ray worker: run ``task`` as ``python -m fedpriv.executor.worker`` and return its exit
    status, its log, its result and (without a shared filesystem) the files it wrote."""
    shared = bool(token) and os.path.exists(token)
    with tempfile.TemporaryDirectory(prefix="fedpriv-ray-") as scratch:
        run_dir = cwd if shared else _scratch_tree(os.getcwd(), scratch, task.get("outputs"))
        spec = os.path.join(scratch, "task.json")
        with open(spec, "w") as f:
            json.dump({k: task[k] for k in ("key", "target", "kwargs")}, f)
        t0 = time.time() - 1.0  # mtime resolution
        proc = subprocess.run([sys.executable, "-m", "fedpriv.executor.worker", spec], cwd=run_dir,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env})
        try:
            with open(spec + ".result") as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {}
        files = {}
        if not shared and task.get("outputs") and proc.returncode == 0:
            files = _collect(os.path.join(run_dir, task["outputs"]), t0)
        return {"rc": proc.returncode, "log": proc.stdout.decode("utf-8", "replace"), "result": result,
                "files": files, "shared": shared}


def _write_back(outputs: str, files: dict) -> None:
    """Write a remote task's files into ``outputs``; a finished run's summary.json with another
    run key is never replaced (:class:`ExecutorError`)."""
    for rel, data in files.items():
        path = os.path.join(outputs, rel)
        if os.path.basename(path) == "summary.json" and os.path.exists(path):
            try:
                old, new = json.load(open(path)).get("run_key"), json.loads(data).get("run_key")
            except (OSError, ValueError, AttributeError):
                old = new = None
            if old is not None and old != new:
                raise ExecutorError(f"{path} holds run key {old}; a cluster task returned {new}: not replaced")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def run_on_ray(tasks: list[Task], *, workers, cores_per_worker: int, retries: int, log_dir: str,
               address: str | None, progress: bool = True, log=None, shared_fs: bool | None = None
               ) -> list[TaskResult]:
    """:func:`fedpriv.executor.run_tasks` on Ray. ``workers``: "auto" (as many at once as the
    cluster's resources allow) or a cap on the tasks in flight. ``shared_fs=False`` forces the
    write-back path (tests exercise it on a local instance)."""
    ray = connect(address)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    remote = ray.remote(num_cpus=cores_per_worker, num_gpus=1 if gpus else 0, max_retries=retries)(execute)
    cap = len(tasks) if workers == "auto" else max(1, int(workers))
    os.makedirs(log_dir, exist_ok=True)
    token = ""
    if shared_fs is not False:
        token = os.path.abspath(os.path.join(log_dir, f".shared-{uuid.uuid4().hex}"))
        open(token, "w").close()
    env = {k: v for k, v in _child_env().items() if k.startswith(("FEDPRIV_", "JAX_", "XLA_", "PYTHON"))}
    cwd = os.getcwd()
    queue = [(t, 1) for t in tasks]
    inflight: dict = {}
    results: dict[str, TaskResult] = {}
    spent = {t.key: [0.0, 0.0] for t in tasks}
    _say(log, f"fedpriv.executor: {len(tasks)} tasks on Ray ({int(ray.cluster_resources().get('CPU', 0))} CPUs, "
              f"{gpus} GPUs; {'one GPU' if gpus else f'{cores_per_worker} CPU(s)'} per task); logs in {log_dir}")
    bar = tqdm(total=len(tasks), desc="runs", unit="run", disable=not progress, file=sys.stderr)
    try:
        while queue or inflight:
            while queue and len(inflight) < cap:
                task, attempt = queue.pop(0)
                ref = remote.remote({"key": task.key, "target": task.target, "kwargs": task.kwargs,
                                     "outputs": task.outputs}, cwd, token, env)
                inflight[ref] = (task, attempt, time.perf_counter())
            done, _ = ray.wait(list(inflight), num_returns=1, timeout=5.0)
            for ref in done:
                task, attempt, t0 = inflight.pop(ref)
                path = os.path.join(log_dir, f"{task.key}.log")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as e:  # the Ray worker itself died (retries spent)
                    out = {"rc": -1, "log": f"Ray: {type(e).__name__}: {e}\n", "result": {}, "files": {}}
                with open(path, "a" if attempt > 1 else "w") as f:
                    f.write(out["log"])
                spent[task.key][0] += time.perf_counter() - t0
                spent[task.key][1] += float(out["result"].get("cpu_s") or 0.0)
                rc = out["rc"]
                if rc == 0:
                    if out["files"] and task.outputs:
                        _write_back(task.outputs, out["files"])
                    results[task.key] = TaskResult(task.key, "done", 0, attempt, *spent[task.key], path,
                                                   out["result"].get("value"))
                    bar.update(1)
                elif rc != USER_ERROR_STATUS and attempt <= retries:
                    _say(log, f"fedpriv.executor: task {task.key}: exited {rc} on Ray; retrying "
                              f"(attempt {attempt + 1} of {retries + 1})")
                    queue.insert(0, (task, attempt + 1))
                else:
                    _say(log, f"fedpriv.executor: task {task.key} FAILED on Ray (exit {rc}; log {path})")
                    results[task.key] = TaskResult(task.key, "failed", rc, attempt, *spent[task.key], path)
                    bar.update(1)
    finally:
        for ref in inflight:
            ray.cancel(ref, force=True)
        bar.close()
        if token and os.path.exists(token):
            os.remove(token)
    return [results[t.key] for t in tasks]
