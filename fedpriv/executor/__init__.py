"""Run an artefact's independent runs side by side: one worker process per core (CPU) or per
accelerator, or on a Ray cluster (issue 51).

An artefact (a paper's table or figure) is a set of independent runs: seeds x rows x epsilons x
grid points. Each is a :class:`Task`: a function named by ``"module:function"`` and JSON keyword
arguments; the function writes its results into its own work directory (resumable, skipped when
finished), so merging is reading those directories back by run key. :func:`run_tasks` runs the
tasks in worker processes (``python -m fedpriv.executor.worker``), each pinned to its own
``cores_per_worker`` CPU cores (``os.sched_setaffinity``) and, on a GPU host, given one device
(``CUDA_VISIBLE_DEVICES``):

- **Same numbers however many workers.** XLA's CPU kernels split their work by the threads they
  have, which moves the last float digits; every task therefore runs pinned to the same number
  of cores whether one worker or eight run, so ``workers=1`` and ``workers="auto"`` give
  identical results. (A run made in-process, unpinned, may differ in its last digits: the run
  keys do not depend on it.)
- **Nothing dropped silently.** A worker that dies (a signal, an out-of-memory kill, a crash) has
  its task reported and retried (``retries``, default 1; the run resumes from its checkpoints);
  a task that fails on bad input (exit status 2) is not retried. After every other task finished,
  :class:`ExecutorError` names each failed task and its log.
- **Progress** per task (the last line of its log) and overall (a tqdm bar on stderr).
- Each task's output (stdout and stderr) goes to ``<log_dir>/<key>.log``.

``backend="ray"`` (:mod:`fedpriv.executor.cluster`) sends the same tasks to a Ray cluster, one
per accelerator (or ``cores_per_worker`` CPUs), and writes each task's outputs back.

    from fedpriv.executor import Task, run_tasks
    tasks = [Task(f"seed{s}", "mypkg.runs:train_one", {"seed": s, "workdir": f"runs/x/seed{s}"})
             for s in range(8)]
    run_tasks(tasks, workers="auto", log_dir="runs/x/_executor")
"""
from fedpriv.executor.core import (
    ExecutorError,
    Task,
    TaskResult,
    accelerator_count,
    resolve_workers,
    run_tasks,
)

__all__ = ["ExecutorError", "Task", "TaskResult", "accelerator_count", "resolve_workers", "run_tasks"]
