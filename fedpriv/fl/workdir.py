"""One writer per work directory: an exclusive, re-entrant lock held for a whole run (issue 24).

Two processes writing one workdir corrupt it without failing: started 2 s apart, both finish
with every round twice in ``metrics.jsonl`` and the summary's curve doubled; started together,
both die in orbax. A run therefore holds ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``<workdir>/.lock`` for as long as it writes there (``fedpriv.fl.loop.train``,
``replace_params``, ``fork_run``; every experiment, from ``experiments.common`` for its whole
``main``). A second process is refused at once with one line naming the workdir and the holder
(pid, host, start time and command, which the holder writes into the lock file).

- **Crash-safe.** The kernel drops a ``flock`` when its holder exits, however it exits (kill -9
  included), so a lock file left behind by a dead process is simply taken over: a stale lock is
  detected by the kernel, never guessed from a pid.
- **Re-entrant within one process.** An experiment holding its workdir calls ``train`` on the
  same directory many times: the process counts its holds (``flock`` on a second open file of
  the same process would refuse itself). Threads of one process share the hold.
- **Clean.** The last release unlinks the lock file while still holding the lock (a waiter that
  opened the old file re-checks the inode after locking, the classic unlink-safe protocol) and
  removes the workdir again if this hold created it and it is still empty: a refused or failed
  run leaves the directory as it found it.
- Bad workdirs (a regular file, a directory that cannot be created or written) are refused with
  one line (``WorkdirError``) before anything else happens.

Under ``jax.distributed`` all processes are one run: the loop locks ``.lock`` on process 0 and
``.lock.p<i>`` on process i, so two distributed runs still collide on process 0.

Locks are advisory (only fedpriv honours them) and need a local filesystem with ``flock``
(NFSv4 emulates it); a filesystem without locks is refused, never silently unlocked.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import threading
import time

from fedpriv.errors import FedprivError

LOCK_FILE = ".lock"

__all__ = ["LOCK_FILE", "WorkdirError", "WorkdirLocked", "WorkdirLock", "acquire", "locked",
           "check_workdir", "describe_os_error", "holder"]


class WorkdirError(FedprivError):
    """A work directory cannot be used (not a directory, not writable, disk full, ...)."""


class WorkdirLocked(WorkdirError):
    """Another process holds the work directory's lock (the message names it)."""


def describe_os_error(err: OSError) -> str:
    """``'No space left on device (ENOSPC)'`` for an ``OSError``: the problem, in words."""
    code = errno.errorcode.get(err.errno or 0)
    if err.errno:
        text = err.strerror or os.strerror(err.errno)
    else:
        text = str(err) or type(err).__name__
    return f"{text} ({code})" if code else text


def check_workdir(path: str) -> bool:
    """Make sure ``path`` is a directory fedpriv can use, creating it if missing.

    Returns whether it was created. Raises ``WorkdirError`` (one line) for a path that is a
    regular file (or under one) or a directory that cannot be created.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise WorkdirError(f"workdir must be a non-empty path, got {path!r}")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WorkdirError(f"workdir {path!r} is a regular file, not a directory; pass a directory "
                           "(it is created if missing)")
    if os.path.isdir(path):
        return False
    try:
        os.makedirs(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise WorkdirError(f"workdir {path!r} is a regular file, not a directory") from None
        return False  # created by someone else in between
    except NotADirectoryError as err:
        raise WorkdirError(f"cannot create workdir {path!r}: a parent is a regular file") from err
    except OSError as err:
        raise WorkdirError(f"cannot create workdir {path!r}: {describe_os_error(err)}") from err
    return True


# realpath of the lock file -> [fd, holds, created dir or None]; one entry per process
_HELD: dict[str, list] = {}
_GUARD = threading.RLock()


def _forget_after_fork():  # a forked child is another process: it holds nothing
    for fd, *_ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def holder(workdir: str, name: str = LOCK_FILE) -> dict | None:
    """What the holder of ``workdir``'s lock wrote about itself (pid, host, started, command),
    or None (no lock file, or unreadable: e.g. being written)."""
    try:
        with open(os.path.join(workdir, name)) as f:
            info = json.loads(f.read() or "null")
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def _describe_holder(info: dict | None) -> str:
    if not info:
        return "another process (it has not written its name yet)"
    since = info.get("started")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(
        since, (int, float)) else "?"
    cmd = " ".join(str(info.get("command", "")).split())
    cmd = cmd if len(cmd) <= 120 else cmd[:117] + "..."
    return (f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}"
            + (f" ({cmd})" if cmd else ""))


class WorkdirLock:
    """One hold of a workdir's lock (see ``acquire``); ``release()`` once, or use ``with``."""

    def __init__(self, key: str, workdir: str):
        self._key, self.workdir, self._released = key, workdir, False

    def release(self) -> None:
        with _GUARD:
            if self._released:
                return
            self._released = True
            entry = _HELD.get(self._key)
            if entry is None:  # forgotten after a fork
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _HELD[self._key]
            fd, _, created = entry
            with contextlib.suppress(OSError):
                os.unlink(self._key)  # while still holding it (waiters re-check the inode)
            os.close(fd)
            if created:
                with contextlib.suppress(OSError):
                    os.rmdir(created)  # only if this hold created it and it is still empty

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def acquire(workdir: str, name: str = LOCK_FILE) -> WorkdirLock:
    """Take ``workdir``'s exclusive lock for this process (creating the directory if needed).

    Non-blocking: raises ``WorkdirLocked`` naming the holder if another process has it, and
    ``WorkdirError`` if the workdir is unusable. Re-entrant within the process. Returns a
    ``WorkdirLock`` to ``release()`` (or use as a context manager).
    """
    import fcntl

    created = check_workdir(workdir)
    workdir = os.fspath(workdir)
    key = os.path.join(os.path.realpath(workdir), name)
    with _GUARD:
        entry = _HELD.get(key)
        if entry is not None:
            entry[1] += 1
            return WorkdirLock(key, workdir)
        for _ in range(100):  # retried only when the file was unlinked under us
            try:
                fd = os.open(key, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as err:
                if created:
                    with contextlib.suppress(OSError):
                        os.rmdir(workdir)
                raise WorkdirError(f"workdir {workdir!r} is not writable: cannot create its lock "
                                   f"file: {describe_os_error(err)}") from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    who = _describe_holder(holder(workdir, name))
                    raise WorkdirLocked(
                        f"workdir {workdir!r} is in use by another run: {who}; one writer per "
                        "workdir: wait for it to finish or use another workdir") from None
                raise WorkdirError(f"cannot lock workdir {workdir!r}: {describe_os_error(err)} (a "
                                   "filesystem without flock cannot guard one writer per workdir)") from err
            try:
                same = os.fstat(fd).st_ino == os.stat(key).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its holder released (and unlinked) it between our open and flock
                os.close(fd)
                continue
            info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                    "command": " ".join(sys.argv)[:1000]}
            try:
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps(info).encode())
            except OSError as err:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(key)
                raise WorkdirError(f"cannot write the lock file of workdir {workdir!r}: "
                                   f"{describe_os_error(err)}") from err
            _HELD[key] = [fd, 1, workdir if created else None]
            return WorkdirLock(key, workdir)
        raise WorkdirLocked(f"workdir {workdir!r}: its lock file keeps being replaced; another run "
                            "is starting and stopping there")


@contextlib.contextmanager
def locked(workdir: str | None, name: str = LOCK_FILE):
    """``with locked(workdir):`` hold ``workdir``'s lock for the block (no-op for None)."""
    if workdir is None:
        yield None
        return
    lock = acquire(workdir, name)
    try:
        yield lock
    finally:
        lock.release()
