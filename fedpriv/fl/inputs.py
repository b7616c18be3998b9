"""Checks of ``fedpriv.fl.loop.train``'s data arguments, before anything is charged or run.

A misuse of the public API is refused in one line naming the input (:class:`TrainInputError`, a
``ValueError``) rather than failing in the middle of a run (a ``KeyError`` for a client id the
dataset lacks, a JAX trace error deep in the caller's loss for parameters of another model):

- ``client_ids``: a sequence of distinct ids (not a string), each a key of ``dataset`` (a
  repeated id would make one user two population members: the user-level accounting counts
  each member once);
- ``dataset``: a mapping client id -> dict of example arrays; every client has examples, the
  same fields, each numeric with the same per-example shape;
- ``init_params``: a non-empty pytree of floating-point arrays (the gradients are taken w.r.t.
  them);
- ``seed``: an int in ``[0, 2^63)`` (JAX keys and NumPy generators both take it);
- :func:`describe_trace_error`: the one-line message of the loop's dry run (``jax.eval_shape``
  of one round) when the caller's parameters and data do not fit the model (or the loss raises
  while tracing): a :class:`TrainInputError` that is still of the class raised (``KeyError``,
  ``TypeError``, ``IndexError``), so a caller catching what its loss raises still catches it.
"""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

import jax
import numpy as np

from fedpriv.errors import FedprivError

__all__ = ["TrainInputError", "check_client_ids", "check_examples", "check_params", "check_seed",
           "describe_trace_error"]

MAX_SEED = 2**63 - 1


class TrainInputError(FedprivError, ValueError):
    """An argument of ``train`` / ``load_run`` that cannot be what the call needs (the message
    names it)."""


class _TraceTypeError(TrainInputError, TypeError):
    """:class:`TrainInputError` of a round that raised ``TypeError`` while tracing (still a
    ``TypeError`` for callers that catch what their loss raises)."""


class _TraceKeyError(TrainInputError, KeyError):
    """... that raised ``KeyError`` (still a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would print repr(args)
        return str(self.args[0]) if self.args else ""


class _TraceIndexError(TrainInputError, IndexError):
    """... that raised ``IndexError`` (still an ``IndexError``)."""


def _shown(ids, limit: int = 3) -> str:
    head = ", ".join(repr(c) for c in ids[:limit])
    return head + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def check_seed(seed) -> int:
    """``seed`` as an int if it is an integer in ``[0, 2^63)`` (not a bool, not a key)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed <= MAX_SEED:
        shown = repr(seed) if isinstance(seed, (int, float, str, np.integer)) else f"a {type(seed).__name__}"
        raise TrainInputError(f"seed must be an integer in [0, 2^63), got {shown} (train derives its "
                              "keys from it: pass an int, not a key)")
    return int(seed)


def check_client_ids(dataset, client_ids) -> None:
    """Refuse a ``client_ids`` that is a string, repeats an id, or names ids ``dataset`` lacks,
    and a ``dataset`` that is not a mapping."""
    if isinstance(client_ids, (str, bytes)):
        raise TrainInputError(f"client_ids must be a sequence of client ids, not a string: {client_ids!r}")
    if not isinstance(dataset, Mapping) and not hasattr(dataset, "num_examples"):
        raise TrainInputError(f"dataset must be a mapping client id -> dict of example arrays, got "
                              f"{type(dataset).__name__}")
    ids = list(client_ids)
    repeated = [c for c, n in collections.Counter(ids).items() if n > 1]
    if repeated:
        raise TrainInputError(f"client_ids repeat {_shown(repeated)}: each population member must be a "
                              "distinct user (user-level accounting counts each member once)")
    missing = [c for c in ids if c not in dataset]
    if missing:
        raise TrainInputError(f"client ids not in the dataset: {_shown(missing)} ({len(missing)} of "
                              f"{len(ids)} client_ids)")


def _spec(cid, examples) -> dict:
    if not isinstance(examples, Mapping) or not examples:
        raise TrainInputError(f"client {cid!r}: expected a dict of example arrays, got "
                              f"{type(examples).__name__}")
    out, counts = {}, set()
    for k, v in examples.items():
        shape, dtype = np.shape(v), getattr(v, "dtype", None) or np.asarray(v).dtype
        if not shape or not (np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)):
            raise TrainInputError(f"client {cid!r}: field {k!r} must be a numeric array with one row per "
                                  f"example, got dtype {dtype} and shape {tuple(shape)}")
        out[k], _ = tuple(shape[1:]), counts.add(shape[0])
    if len(counts) > 1:
        raise TrainInputError(f"client {cid!r}: fields have different numbers of examples "
                              f"{ {k: np.shape(v)[0] for k, v in examples.items()} }")
    if counts == {0}:
        raise TrainInputError(f"client {cid!r} has no examples; drop empty clients before training")
    return out


def check_examples(dataset, client_ids: Sequence) -> None:
    """Every client of ``client_ids`` has examples with the first client's fields and per-example
    shapes (a dataset with ``num_examples``, e.g. ``FederatedDataset``, stores every client in
    the same arrays: its first client's fields and every client's count are checked)."""
    ids = list(client_ids)
    if not ids:
        return
    ref = _spec(ids[0], dataset[ids[0]])
    if hasattr(dataset, "num_examples"):
        empty = [c for c in ids if int(dataset.num_examples(c)) == 0]
        if empty:
            raise TrainInputError(f"clients with no examples: {_shown(empty)}; drop empty clients "
                                  "before training")
        return
    for c in ids[1:]:
        spec = _spec(c, dataset[c])
        if spec != ref:
            raise TrainInputError(f"client {c!r} has fields {spec} but client {ids[0]!r} has {ref} "
                                  "(fields: per-example shapes)")


def check_params(init_params) -> None:
    """``init_params``: a non-empty pytree of floating-point arrays."""
    leaves = jax.tree_util.tree_leaves_with_path(init_params)
    if not leaves:
        raise TrainInputError(f"init_params has no arrays (got {type(init_params).__name__}): pass the "
                              "model's parameter pytree")
    for path, leaf in leaves:
        dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
        if not np.issubdtype(dtype, np.inexact):
            raise TrainInputError(f"init_params{jax.tree_util.keystr(path)} has dtype {dtype}: parameters "
                                  "must be floating point (gradients are taken w.r.t. them)")


def _shapes(tree, limit: int = 6) -> str:
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    shown = ", ".join(f"{jax.tree_util.keystr(p)}: {getattr(x, 'dtype', type(x).__name__)}{list(np.shape(x))}"
                      for p, x in leaves[:limit])
    return shown + (f", ... {len(leaves) - limit} more" if len(leaves) > limit else "")


def describe_trace_error(err: Exception, params, cid, examples) -> TrainInputError:
    """The one-line error of a round that cannot be traced on ``params`` and client ``cid``'s
    ``examples`` (``err``: what the caller's loss or the engine raised while tracing)."""
    first = (str(err).strip().splitlines() or [""])[0][:300]
    cls = next((c for base, c in ((KeyError, _TraceKeyError), (IndexError, _TraceIndexError),
                                  (TypeError, _TraceTypeError)) if isinstance(err, base)), TrainInputError)
    return cls(
        f"one round cannot be traced on init_params ({_shapes(params)}) and the examples of client "
        f"{cid!r} ({_shapes(examples)}): {type(err).__name__}: {first} -- check that init_params are "
        "the parameters of the model the loss expects and the dataset's fields its inputs")
