"""A worker of :mod:`fedpriv.executor`: ``python -m fedpriv.executor.worker TASK.json`` imports the
task's ``target`` ("package.module:function"), calls it with the task's keyword arguments and
writes ``TASK.json.result`` (its CPU seconds and, if JSON, the value it returned).

Exit status: 0 done; 2 a user error (a :class:`fedpriv.errors.FedprivError`, ``ValueError``,
missing file ...: one line, not retried by the executor); 1 any other exception (its traceback
in the task's log; retried). A worker killed by a signal is retried too.
"""
from __future__ import annotations

import os

# pinned before anything starts threads (jax, numpy's BLAS): XLA sizes its CPU thread pool by
# the cores this process may use, and the executor gives every task the same number of them
if os.environ.get("FEDPRIV_EXECUTOR_CORES") and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(c) for c in os.environ["FEDPRIV_EXECUTOR_CORES"].split(",")})

import importlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from fedpriv.errors import FedprivError  # noqa: E402


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def resolve(target: str):
    """The object ``target`` = ``"package.module:name"`` names (dots allowed after the colon
    for an attribute path)."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m fedpriv.executor.worker TASK.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    print(f"fedpriv.executor.worker: task {spec['key']}: {spec['target']}", flush=True)
    status, value = 1, None
    try:
        value = resolve(spec["target"])(**spec.get("kwargs", {}))
        status = 0
    except (FedprivError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError) as e:  # bad input: one line, rerunning cannot help
        print(f"fedpriv.executor.worker: task {spec['key']}: error: {type(e).__name__}: "
              f"{' '.join(str(e).split())}", flush=True)
        status = 2
    finally:  # also after a crash (its traceback follows in the log): the CPU it cost
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = None
        with open(argv[0] + ".result", "w") as f:
            json.dump({"status": status, "value": value, "wall_s": time.perf_counter() - t0,
                       "cpu_s": _cpu_seconds()}, f)
    return status


if __name__ == "__main__":
    sys.exit(main())
