"""Tasks, worker slots and the local process executor (see :mod:`fedpriv.executor`)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tqdm import tqdm

# (the task types are a leaf module, so the backends import them without importing this one)
from fedpriv.executor.tasks import (  # noqa: F401 (re-exported)
    USER_ERROR_STATUS,
    ExecutorError,
    Task,
    TaskResult,
    _child_env,
    _say,
)


def accelerator_count() -> int:
    """GPUs visible to this host, without initialising any backend in this process (a parent
    that initialised CUDA would hold memory its workers need): ``CUDA_VISIBLE_DEVICES`` if set,
    else the lines of ``nvidia-smi -L``; 0 without GPUs. (TPU hosts: one worker drives all chips.)"""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def resolve_workers(workers, cores_per_worker: int = 1, n_tasks: int | None = None) -> int:
    """The number of worker processes: ``"auto"`` = one per GPU on a GPU host, else one per
    ``cores_per_worker`` cores of this process's affinity; an int >= 1 as given (refused above
    the cores available: pinned workers cannot share cores). Never more than ``n_tasks``."""
    if cores_per_worker < 1:
        raise ExecutorError(f"cores_per_worker = {cores_per_worker!r}: at least 1")
    cores = len(_cores())
    if workers == "auto":
        n = accelerator_count() or max(1, cores // cores_per_worker)
    else:
        try:
            n = int(workers)
        except (TypeError, ValueError):
            raise ExecutorError(f"workers = {workers!r}: 'auto' or a positive integer") from None
        if n < 1 or str(n) != str(workers).strip():
            raise ExecutorError(f"workers = {workers!r}: 'auto' or a positive integer")
        if n * cores_per_worker > cores and not accelerator_count():
            raise ExecutorError(f"workers = {n} x cores_per_worker = {cores_per_worker} needs {n * cores_per_worker} "
                                f"cores; this process may use {cores}")
    return max(1, min(n, n_tasks)) if n_tasks else n


@dataclasses.dataclass
class _Slot:
    index: int
    cores: list[int]
    device: int | None


def _slots(n: int, cores_per_worker: int) -> list[_Slot]:
    cores, gpus = _cores(), accelerator_count()
    if gpus and n > gpus:
        raise ExecutorError(f"{n} workers for {gpus} GPUs: one worker per device")
    per = cores_per_worker if n * cores_per_worker <= len(cores) else max(1, len(cores) // n)
    return [_Slot(i, cores[i * per:(i + 1) * per] or cores[-per:], i if gpus else None) for i in range(n)]


def _last_line(path: str, size: int = 4096) -> str:
    """The last non-empty line (or tqdm's last carriage-return update) of a log file."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    parts = [p.strip() for p in re.split(r"[\r\n]", tail) if p.strip()]
    return parts[-1][:100] if parts else ""


class _Running:
    def __init__(self, task: Task, slot: _Slot, log_path: str, attempt: int, env: dict, workdir: str):
        self.task, self.slot, self.log_path, self.attempt = task, slot, log_path, attempt
        self.spec = os.path.join(workdir, f"task-{slot.index}-{attempt}-{abs(hash(task.key))}.json")
        with open(self.spec, "w") as f:
            json.dump({"key": task.key, "target": task.target, "kwargs": task.kwargs}, f)
        child_env = dict(env, FEDPRIV_EXECUTOR_CORES=",".join(map(str, slot.cores)))  # the worker pins itself
        if slot.device is not None:
            child_env["CUDA_VISIBLE_DEVICES"] = str(slot.device)
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        mode = "a" if attempt > 1 else "w"
        with open(log_path, mode) as log:
            if attempt > 1:
                log.write(f"\n==== fedpriv.executor: attempt {attempt} of task {task.key} ====\n")
                log.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "fedpriv.executor.worker", self.spec],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=child_env)
        self.t0 = time.perf_counter()

    def result(self) -> dict:
        try:
            with open(self.spec + ".result") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


def run_tasks(tasks, *, workers="auto", cores_per_worker: int = 1, retries: int = 1,
              log_dir: str, progress: bool = True, backend: str = "local", address: str | None = None,
              log=None) -> list[TaskResult]:
    """Run ``tasks`` (a sequence of :class:`Task`) and return one :class:`TaskResult` each, in
    order. ``workers``: ``"auto"`` or a positive int (:func:`resolve_workers`);
    ``cores_per_worker``: CPU cores each worker is pinned to (the same for any number of workers,
    so the numbers do not depend on it); ``retries``: how many more times a task whose worker
    died is started again (it resumes from its work directory); ``log_dir``: where each task's
    log goes. ``backend="ray"`` with ``address`` (``"auto"``, ``"ray://host:10001"``, or None
    for a local instance) runs them on a Ray cluster (:mod:`fedpriv.executor.cluster`).
    Raises :class:`ExecutorError` naming every task that failed, after all the others finished."""
    tasks = list(tasks)
    keys = [t.key for t in tasks]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ExecutorError(f"task keys must be unique; repeated: {', '.join(dup)}")
    if not isinstance(retries, int) or retries < 0:
        raise ExecutorError(f"retries = {retries!r}: a non-negative integer")
    if backend == "ray":
        from fedpriv.executor import cluster  # ray is imported only for this backend
        results = cluster.run_on_ray(tasks, workers=workers, cores_per_worker=cores_per_worker, retries=retries,
                                     log_dir=log_dir, address=address, progress=progress, log=log)
    elif backend == "local":
        results = _run_local(tasks, workers, cores_per_worker, retries, log_dir, progress, log)
    else:
        raise ExecutorError(f"backend {backend!r}: 'local' or 'ray'")
    failed = [r for r in results if r.status != "done"]
    if failed:
        raise ExecutorError(f"{len(failed)} of {len(results)} tasks failed: " + "; ".join(
            f"{r.key} (exit {r.returncode} after {r.attempts} attempt(s); log {r.log})" for r in failed))
    return results


def _run_local(tasks, workers, cores_per_worker, retries, log_dir, progress, log) -> list[TaskResult]:
    if not tasks:
        return []
    n = resolve_workers(workers, cores_per_worker, len(tasks))
    slots = _slots(n, cores_per_worker)
    env = _child_env()
    os.makedirs(log_dir, exist_ok=True)
    queue = [(t, 1) for t in tasks]
    results: dict[str, TaskResult] = {}
    spent: dict[str, list[float]] = {t.key: [0.0, 0.0] for t in tasks}
    running: dict[int, _Running] = {}
    where = ", ".join("cores " + ",".join(map(str, s.cores)) + ("" if s.device is None else f" gpu {s.device}")
                      for s in slots)
    _say(log, f"fedpriv.executor: {len(tasks)} tasks on {n} worker(s) ({where}); logs in {log_dir}")
    tty = sys.stderr.isatty()
    bar = tqdm(total=len(tasks), desc="runs", unit="run", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, mininterval=1.0 if tty else 60.0)
    with tempfile.TemporaryDirectory(prefix="fedpriv-exec-") as scratch:
        try:
            while queue or running:
                for slot in slots:
                    if slot.index not in running and queue:
                        task, attempt = queue.pop(0)
                        running[slot.index] = _Running(task, slot, os.path.join(log_dir, f"{task.key}.log"),
                                                       attempt, env, scratch)
                time.sleep(0.2)
                for i, r in list(running.items()):
                    rc = r.proc.poll()
                    if rc is None:
                        continue
                    del running[i]
                    out = r.result()
                    spent[r.task.key][0] += time.perf_counter() - r.t0
                    spent[r.task.key][1] += float(out.get("cpu_s") or 0.0)
                    if rc == 0:
                        results[r.task.key] = TaskResult(r.task.key, "done", 0, r.attempt, *spent[r.task.key],
                                                         r.log_path, out.get("value"))
                        bar.update(1)
                    elif rc != USER_ERROR_STATUS and r.attempt <= retries:
                        _say(log, f"fedpriv.executor: task {r.task.key}: worker exited {rc} "
                                  f"({_last_line(r.log_path) or 'no output'}); retrying "
                                  f"(attempt {r.attempt + 1} of {retries + 1})")
                        queue.insert(0, (r.task, r.attempt + 1))
                    else:
                        _say(log, f"fedpriv.executor: task {r.task.key} FAILED (exit {rc}): "
                                  f"{_last_line(r.log_path) or 'no output'} (log {r.log_path})")
                        results[r.task.key] = TaskResult(r.task.key, "failed", rc, r.attempt, *spent[r.task.key],
                                                         r.log_path)
                        bar.update(1)
                if progress and running:  # shown at the bar's next update (tqdm's mininterval)
                    bar.set_postfix_str(" | ".join(f"{r.task.key}: {_last_line(r.log_path)[:40]}"
                                                   for r in running.values())[:160], refresh=False)
                    bar.update(0)
        finally:
            for r in running.values():  # interrupted: stop the workers (their runs resume later)
                r.proc.terminate()
            for r in running.values():
                try:
                    r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
            bar.close()
    return [results[t.key] for t in tasks]
