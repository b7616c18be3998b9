"""One atomic checkpoint per commit (orbax-checkpoint), used by every training loop in fedpriv.

A commit is one orbax step directory ``<dir>/<n>`` holding two items written together:
``state`` (the pytree: params, optimizer, noise/clip state with PRNG keys as raw key data) and
``meta`` (JSON: round/step, ledger, config fingerprint, anything else). Orbax writes the step
into a temporary directory and renames it into place when complete, so a crash (kill -9) leaves
either the previous commit or the new one — never a state from one round with metadata from
another. ``n`` is a commit counter (not the round): re-committing the same round (e.g.
``loop.replace_params``) is a new commit. The last ``keep`` commits are kept.

Integrity: ``meta["digest"]`` is a SHA-256 over the state's leaves (dtype, shape, bytes) and
the rest of the metadata; ``restore`` refuses a commit whose digest does not match (a hand-
edited round or ledger, a state file swapped in from another commit). It detects accidents
and edits, not a forger who recomputes the hash.

Recovery: a damaged latest commit (unreadable, or failing its integrity check) is passed over
for the newest intact older one (``restore``/``meta`` record what they skipped in
``Checkpointer.skipped``; the loop says so in one line and checks that the older commit's
ledger still covers what ran); with no intact commit the checkpoint is refused. A commit that
cannot be written (disk full, read-only, file size limit) raises one ``CheckpointWriteError``
naming the directory and the OS error, without orbax's multi-line thread tracebacks; earlier
commits stay as they were.

Only ``fedpriv.fl`` reads these files; other code goes through ``fedpriv.fl.loop``
(``load_run``, ``replace_params``, ``fork_run``) or ``Checkpointer``.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError

FORMAT = "fedpriv-checkpoint-v2"
EXTRA_PREFIX = "extra."  # fingerprint fields supplied by the caller
CHECKPOINTS = "checkpoints"  # the subdirectory of a workdir holding the commits


class CheckpointError(FedprivError, RuntimeError):
    """A checkpoint cannot be used: corrupt, of another format, or inconsistent with the run."""


class ResumeMismatch(CheckpointError):
    """The run being resumed was configured differently (names the fields)."""


class CheckpointWriteError(CheckpointError):
    """A commit could not be written (disk full, read-only, ...): names the directory and the
    OS error; earlier commits are intact."""


_UNFINISHED = ".orbax-checkpoint-tmp"  # orbax's name for a commit being written


def _clear_unfinished(directory: str, settle: float = 0.05, tries: int = 100) -> None:
    """Remove the temporary directories of commits that never finished (a failed write, a kill),
    synchronously, before a writer's first commit and after a commit failed (never on a read:
    another process may be writing). A failed commit's array writer (tensorstore's threads, not
    Python's) can still be finishing in this process and add files while they go, which made
    orbax's own asynchronous cleanup of the next attempt fail with ENOENT (once in ~10 retries
    under load): so after removing anything this waits ``settle`` seconds and repeats until none
    is left."""
    if not os.path.isdir(directory):
        return
    for _ in range(tries):
        left = [os.path.join(directory, n) for n in os.listdir(directory) if _UNFINISHED in n]
        if not left:
            return
        for path in left:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)
        time.sleep(settle)
    raise CheckpointWriteError(f"cannot remove the unfinished commit(s) {', '.join(left)}: they keep "
                               "coming back (another process writing to this checkpoint directory?)")


_OS_CODE = re.compile(r"os_error_code='?(\d+)")


def _os_error_of(err: BaseException) -> tuple[int, str] | None:
    """``(errno, text)`` of the OS error behind ``err`` (an ``OSError`` in its chain, or
    tensorstore's ``[os_error_code='28']`` in a ``ValueError``), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno:
            return err.errno, err.strerror or os.strerror(err.errno)
        m = _OS_CODE.search(str(err))
        if m:
            return int(m.group(1)), os.strerror(int(m.group(1)))
        err = err.__cause__ or err.__context__
    return None


class _HoldErrors(logging.Filter):
    """Holds back absl/orbax ERROR records (their writer threads log whole tracebacks) while a
    commit is written; re-emitted if the commit succeeds, dropped when it fails (the error is
    raised as one line instead)."""

    def __init__(self):
        super().__init__()
        self.held = []

    def filter(self, record):
        if record.levelno >= logging.ERROR:
            self.held.append(record)
            return False
        return True


def _drop_closed_loop_reports() -> None:
    """When a write fails (disk full), tensorstore still completes futures of orbax's event
    loop after orbax closed it: Python reports each as an unraisable ``RuntimeError: Event loop
    is closed`` (a 6-line traceback apiece, around the one-line error). Installed by the first
    commit; only that exact report is dropped, every other unraisable exception goes to the
    previous hook."""
    prev = sys.unraisablehook
    if getattr(prev, "_fedpriv_closed_loop_filter", False):
        return

    def hook(unraisable):
        if isinstance(unraisable.exc_value, RuntimeError) and \
                str(unraisable.exc_value) == "Event loop is closed":
            return
        prev(unraisable)
    hook._fedpriv_closed_loop_filter = True
    sys.unraisablehook = hook


@contextlib.contextmanager
def _quiet_orbax_errors():
    log = logging.getLogger("absl")
    hold = _HoldErrors()
    log.addFilter(hold)
    try:
        yield
    except BaseException:
        raise
    else:
        log.removeFilter(hold)
        for record in hold.held:
            log.handle(record)
    finally:
        log.removeFilter(hold)


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(tree):
    """Pytree -> NumPy arrays (typed PRNG keys -> their raw key data)."""
    return jax.tree_util.tree_map(
        lambda x: np.asarray(jax.random.key_data(x) if _is_key(x) else x), tree)


def from_host(tree, template):
    """Inverse of ``to_host`` given a template with the original leaf types (keys re-wrapped)."""
    return jax.tree_util.tree_map(
        lambda x, t: jax.random.wrap_key_data(jnp.asarray(x), impl=jax.random.key_impl(t))
        if _is_key(t) else jnp.asarray(x, dtype=t.dtype), tree, template)


def json_safe(x):
    """Config values -> strict JSON (non-finite floats as strings, tuples as lists)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return json_safe(x.item())
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)


def digest(host_state, meta: dict) -> str:
    """SHA-256 over the state leaves (dtype, shape, bytes), tree structure and ``meta``."""
    h = hashlib.sha256()
    leaves, treedef = jax.tree_util.tree_flatten(host_state)
    h.update(str(treedef).encode())
    for leaf in leaves:
        a = np.ascontiguousarray(leaf)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    h.update(json.dumps({k: v for k, v in meta.items() if k != "digest"}, sort_keys=True).encode())
    return h.hexdigest()


def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v and not k.startswith(EXTRA_PREFIX):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_fingerprint(saved: Mapping, current: Mapping, resume_anyway: Sequence[str], where: str,
                      overridable: Callable[[str], bool]) -> None:
    """Raise ``ResumeMismatch`` naming every field that differs (dotted, e.g.
    ``dp.noise_multiplier``) unless each is ``overridable`` and named in ``resume_anyway`` (by
    its top-level name; a caller field ``extra.<name>`` by ``<name>`` or ``extra.<name>``)."""
    a, b = _flatten(saved), _flatten(current)
    absent = "<absent>"
    differ = sorted(k for k in set(a) | set(b) if a.get(k, absent) != b.get(k, absent))
    if not differ:
        return
    top = lambda k: k if k.startswith(EXTRA_PREFIX) else k.split(".")[0]
    bad = [k for k in differ if not overridable(k)]
    named = set(resume_anyway) | {EXTRA_PREFIX + str(n) for n in resume_anyway}
    unnamed = [k for k in differ if overridable(k) and top(k) not in named]
    if bad or unnamed:
        shown = ", ".join(f"{k}: {a.get(k, absent)!r} -> {b.get(k, absent)!r}" for k in bad + unnamed)
        hint = ("; these change privacy: use another workdir" if bad else
                f"; pass resume_anyway={sorted({top(k) for k in unnamed})!r} to continue anyway")
        raise ResumeMismatch(f"{where} holds a run with another config ({shown}){hint}")


class Checkpointer:
    """Atomic commits of ``(state pytree, JSON metadata)`` in ``directory`` (orbax, keep-N).

    ``save(state, meta)`` commits; ``restore(template)`` returns ``(state, meta)`` of the latest
    commit (``None`` if there is none), verified; ``meta(...)`` reads only the metadata.
    """

    def __init__(self, directory: str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self._mgr = None
        self._cleared = False  # unfinished commits removed (once, before this writer's first save)
        self.skipped: list[tuple[int, str]] = []  # damaged commits passed over by the last read
        self.restored_step: int | None = None  # the commit the last read returned

    # orbax is imported (and its manager built) only when a checkpoint is written or read
    @property
    def _manager(self):
        if self._mgr is None:
            import orbax.checkpoint as ocp
            logging.getLogger("absl").setLevel(logging.WARNING)
            opts = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=False,
                                                enable_async_checkpointing=False,
                                                cleanup_tmp_directories=False)  # save() clears
            self._mgr = ocp.CheckpointManager(self.directory, options=opts)
        return self._mgr

    def exists(self) -> bool:
        return os.path.isdir(self.directory) and self.latest() is not None

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[0] if steps else None

    def save(self, state, meta: dict) -> int:
        """Commit ``state`` (any pytree; typed keys allowed) with ``meta``; returns the commit id."""
        import orbax.checkpoint as ocp
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as err:
            code = errno.errorcode.get(err.errno or 0, "?")
            raise CheckpointWriteError(f"cannot create the checkpoint directory {self.directory}: "
                                       f"{err.strerror or err} ({code})") from err
        host = to_host(state)
        meta = json_safe({**meta, "format": FORMAT})
        meta["digest"] = digest(host, meta)
        if not self._cleared:  # a writer only: readers never delete another process's commit
            _clear_unfinished(self.directory)
            self._cleared = True
        last = self.latest()
        step = 0 if last is None else last + 1
        _drop_closed_loop_reports()
        try:
            with _quiet_orbax_errors():
                before = set(threading.enumerate())
                try:
                    self._manager.save(step, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(host), meta=ocp.args.JsonSave(meta)))
                    self._manager.wait_until_finished()
                except BaseException:
                    # let orbax's writer threads of this commit end (quietly) before closing
                    deadline = time.monotonic() + 30.0
                    for t in set(threading.enumerate()) - before:
                        t.join(timeout=max(0.0, deadline - time.monotonic()))
                    with contextlib.suppress(Exception):
                        self.close()
                    with contextlib.suppress(Exception):
                        _clear_unfinished(self.directory)  # the next attempt starts clean
                    raise
        except Exception as err:  # only OS errors become one line; bugs re-raise
            os_err = _os_error_of(err)
            if os_err is None:
                raise
            code, text = os_err
            name = errno.errorcode.get(code, str(code))
            raise CheckpointWriteError(
                f"cannot write checkpoint {step} in {self.directory}: {text} ({name}); the "
                "earlier commits are intact") from err
        return step

    def steps(self) -> list[int]:
        """The commit ids in the directory, newest first."""
        if not os.path.isdir(self.directory):
            return []
        return sorted((int(n) for n in os.listdir(self.directory) if n.isdigit()
                       and os.path.isdir(os.path.join(self.directory, n))), reverse=True)

    def _damaged(self, step: int, err: BaseException) -> str:
        text = " ".join(str(err).split())
        text = text if len(text) <= 200 else text[:197] + "..."
        return f"commit {step}: {type(err).__name__}: {text}"

    def _no_intact(self, what: str):
        return CheckpointError(f"no intact checkpoint in {self.directory} ({what}); refusing it: "
                               + "; ".join(reason for _, reason in self.skipped))

    def raw_meta(self, step: int) -> dict | None:
        """Commit ``step``'s metadata as written, unverified (None if unreadable): what a
        damaged commit recorded, e.g. its ledger."""
        import orbax.checkpoint as ocp
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return dict(out["meta"])
        except Exception:  # damaged
            return None

    def meta(self) -> dict | None:
        """The newest readable commit's metadata (unverified: use ``restore`` before trusting
        it); damaged newer commits are listed in ``self.skipped``."""
        import orbax.checkpoint as ocp
        self.skipped = []
        for step in self.steps():
            try:
                out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            except Exception as err:  # any read failure is a damaged commit
                self.skipped.append((step, self._damaged(step, err)))
                continue
            self.restored_step = step
            return self._check_format(dict(out["meta"]), step)
        if self.skipped:
            raise self._no_intact("every commit is unreadable")
        return None

    def restore(self, template):
        """``(state, meta)`` of the newest intact commit, or ``None`` if there is none.

        A commit that cannot be read or fails its integrity check is damaged: the next older
        one is tried, and ``self.skipped`` lists ``[(commit, reason), ...]`` of those passed
        over (empty when the latest was intact). Raises ``CheckpointError`` when no commit is
        intact, or when an intact commit does not match ``template``'s structure (another model
        or optimizer is not damage: nothing is skipped for it).
        """
        import orbax.checkpoint as ocp
        self.skipped = []
        host_template = to_host(template)
        for step in self.steps():
            try:
                out = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(host_template), meta=ocp.args.JsonRestore()))
            except Exception as err:
                self.skipped.append((step, self._damaged(step, err)))
                continue
            meta = self._check_format(dict(out["meta"]), step)
            host = jax.tree_util.tree_map(np.asarray, out["state"])
            if jax.tree_util.tree_structure(host) != jax.tree_util.tree_structure(host_template):
                raise CheckpointError(f"checkpoint {step} in {self.directory} has another state structure")
            for a, t in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(host_template)):
                if a.shape != t.shape or a.dtype != t.dtype:
                    raise CheckpointError(f"checkpoint {step} in {self.directory}: leaf {a.dtype}{a.shape}"
                                          f" where the run has {t.dtype}{t.shape}")
            if meta.get("digest") != digest(host, meta):
                self.skipped.append((step, f"commit {step}: fails its integrity check (state or "
                                           "metadata edited or mixed from two commits)"))
                continue
            self.restored_step = step
            return from_host(host, template), meta
        if self.skipped:
            raise self._no_intact("every commit is damaged, or was written for another model or "
                                  "optimizer")
        return None

    def quarantine(self, steps) -> str | None:
        """Move damaged commits ``steps`` out of the directory (to ``<directory>.damaged/``,
        nothing deleted), so that keep-N never drops the intact commit a run fell back to in
        their favour. Returns where they went (None if nothing was moved)."""
        steps = [int(s) for s in steps]
        if not steps:
            return None
        self.close()
        dest = self.directory + ".damaged"
        os.makedirs(dest, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for step in steps:
            src = os.path.join(self.directory, str(step))
            if os.path.isdir(src):
                shutil.move(src, os.path.join(dest, f"{step}-{stamp}"))
        return dest

    def _check_format(self, meta: dict, step: int) -> dict:
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {step} in {self.directory} has format "
                                  f"{meta.get('format')!r}, expected {FORMAT!r}")
        return meta

    def close(self):
        if self._mgr is not None:
            self._mgr.close()
            self._mgr = None
