"""The executor's task types (see :mod:`fedpriv.executor`): a leaf module that the local process
executor (``core``) and the cluster backend (``cluster``) both import, so neither imports the
other's module to share them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

from fedpriv.errors import FedprivError
from fedpriv.report import git_state

# exit status of a task that failed on bad input (experiments.common.cli): rerunning cannot help
USER_ERROR_STATUS = 2
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+,@-]*(/[A-Za-z0-9][A-Za-z0-9._=+,@-]*)*$")


class ExecutorError(FedprivError):
    """Tasks failed (the message names each one and its log), or the executor was misconfigured."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One independent run: ``target(**kwargs)`` in a worker.

    key:     unique among the tasks of one :func:`run_tasks` call; names the log file
             (``<log_dir>/<key>.log``; ``/`` makes subfolders). Letters, digits and ``._=+,@-``.
    target:  ``"package.module:function"``, importable in the worker.
    kwargs:  JSON-serialisable keyword arguments (the worker gets them through a file).
    outputs: the directory the task writes (relative to the working directory): the cluster
             backend copies it back to the driver when workers do not share its filesystem.
    """
    key: str
    target: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    outputs: str | None = None

    def __post_init__(self):
        if not isinstance(self.key, str) or not _KEY.match(self.key) or ".." in self.key.split("/"):
            raise ExecutorError(f"task key {self.key!r}: use letters, digits and ._=+,@- (and / for subfolders)")
        module, sep, func = str(self.target).partition(":")
        if not (module and sep and func):
            raise ExecutorError(f"task {self.key}: target {self.target!r} is not 'package.module:function'")
        try:
            json.dumps(self.kwargs)
        except (TypeError, ValueError) as e:
            raise ExecutorError(f"task {self.key}: kwargs are not JSON-serialisable ({e})") from e


@dataclasses.dataclass
class TaskResult:
    """What became of one task: ``status`` "done" / "failed"; ``returncode`` of its last attempt
    (negative: killed by that signal); ``attempts``; wall and CPU seconds of all attempts;
    ``value``: the JSON value the target returned (None if it returned something else)."""
    key: str
    status: str
    returncode: int | None
    attempts: int
    wall_s: float
    cpu_s: float
    log: str
    value: object = None


def _child_env() -> dict:
    """The workers' environment: unbuffered output, and this process's git state so that every
    task records the commit the invocation started at (``fedpriv.report.git_state``)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "FEDPRIV_GIT_STATE": json.dumps(git_state())}


def _say(log, msg: str) -> None:
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
