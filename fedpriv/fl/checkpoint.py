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

Only ``fedpriv.fl`` reads these files; other code goes through ``fedpriv.fl.loop``
(``load_run``, ``replace_params``, ``fork_run``) or ``Checkpointer``.
"""
from __future__ import annotations

from fedpriv.errors import FedprivError

import hashlib
import json
import logging
import math
import os
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "fedpriv-checkpoint-v2"
EXTRA_PREFIX = "extra."  # fingerprint fields supplied by the caller
CHECKPOINTS = "checkpoints"  # the subdirectory of a workdir holding the commits


class CheckpointError(FedprivError, RuntimeError):
    """A checkpoint cannot be used: corrupt, of another format, or inconsistent with the run."""


class ResumeMismatch(CheckpointError):
    """The run being resumed was configured differently (names the fields)."""


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
    top = lambda k: k if k.startswith(EXTRA_PREFIX) else k.split(".")[0]  # noqa: E731
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

    # orbax is imported (and its manager built) only when a checkpoint is written or read
    @property
    def _manager(self):
        if self._mgr is None:
            import orbax.checkpoint as ocp
            logging.getLogger("absl").setLevel(logging.WARNING)
            opts = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=False,
                                                enable_async_checkpointing=False,
                                                cleanup_tmp_directories=True)
            self._mgr = ocp.CheckpointManager(self.directory, options=opts)
        return self._mgr

    def exists(self) -> bool:
        return os.path.isdir(self.directory) and self.latest() is not None

    def latest(self) -> int | None:
        if not os.path.isdir(self.directory):
            return None
        steps = [int(n) for n in os.listdir(self.directory) if n.isdigit()
                 and os.path.isdir(os.path.join(self.directory, n))]
        return max(steps) if steps else None

    def save(self, state, meta: dict) -> int:
        """Commit ``state`` (any pytree; typed keys allowed) with ``meta``; returns the commit id."""
        import orbax.checkpoint as ocp
        os.makedirs(self.directory, exist_ok=True)
        host = to_host(state)
        meta = json_safe({**meta, "format": FORMAT})
        meta["digest"] = digest(host, meta)
        last = self.latest()
        step = 0 if last is None else last + 1
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(host),
                                                         meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()
        return step

    def meta(self) -> dict | None:
        """The latest commit's metadata (unverified: use ``restore`` before trusting it)."""
        import orbax.checkpoint as ocp
        step = self.latest()
        if step is None:
            return None
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as err:  # noqa: BLE001 - any read failure is a corrupt checkpoint
            raise CheckpointError(f"cannot read checkpoint {step} in {self.directory}: {err}") from err
        return self._check_format(dict(out["meta"]), step)

    def restore(self, template):
        """``(state, meta)`` of the latest commit, or ``None``; raises ``CheckpointError`` if the
        commit does not match ``template``'s structure or its digest."""
        import orbax.checkpoint as ocp
        step = self.latest()
        if step is None:
            return None
        host_template = to_host(template)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(host_template), meta=ocp.args.JsonRestore()))
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"cannot restore checkpoint {step} in {self.directory} "
                                  f"(another model or optimizer?): {err}".splitlines()[0]) from err
        meta = self._check_format(dict(out["meta"]), step)
        host = jax.tree_util.tree_map(np.asarray, out["state"])
        if jax.tree_util.tree_structure(host) != jax.tree_util.tree_structure(host_template):
            raise CheckpointError(f"checkpoint {step} in {self.directory} has another state structure")
        for a, t in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(host_template)):
            if a.shape != t.shape or a.dtype != t.dtype:
                raise CheckpointError(f"checkpoint {step} in {self.directory}: leaf {a.dtype}{a.shape}"
                                      f" where the run has {t.dtype}{t.shape}")
        if meta.get("digest") != digest(host, meta):
            raise CheckpointError(f"checkpoint {step} in {self.directory} fails its integrity check "
                                  "(state or metadata edited or mixed from two commits); refusing it")
        return from_host(host, template), meta

    def _check_format(self, meta: dict, step: int) -> dict:
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {step} in {self.directory} has format "
                                  f"{meta.get('format')!r}, expected {FORMAT!r}")
        return meta

    def close(self):
        if self._mgr is not None:
            self._mgr.close()
            self._mgr = None
