"""Task targets for tests/executor (imported by the executor's worker processes)."""
from __future__ import annotations

import os
import signal


def affinity(tag: str) -> dict:
    """The cores this worker may use and a value derived from the task's argument."""
    return {"tag": tag, "cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}


def die_once(marker: str) -> str:
    """Killed by SIGKILL on the first attempt (no marker file yet), done on the second."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return "second attempt"


def bad_input(name: str) -> None:
    raise ValueError(f"bad input {name!r}")


def crash(marker: str) -> None:
    """A bug (not a user error): retried, then reported. Counts its attempts in ``marker``."""
    with open(marker, "a") as f:
        f.write("x")
    raise RuntimeError("a bug")


def write(path: str, text: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return len(text)


def write_where(path: str, text: str) -> str:
    """:func:`write`, returning where the file was written (the absolute path)."""
    write(path, text)
    return os.path.abspath(path)
