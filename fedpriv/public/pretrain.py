"""Central training on public data: pre-training, mid-training, prefinetuning.

Wang et al. 2023 §3.2 / App. B.2 (public pre-training: Adam, lr 1e-3, gradient clipping,
sequence length 20), §4 / App. B.3 (the same loop with the distillation loss), §5 Algorithm 1
step 4 (public mid-training on the selected public subset) and Hou et al. 2023 (prefinetuning
on the dataset FreD chooses). Public data carries no privacy cost; when the model being
trained is a DP checkpoint, the result is post-processing (record it in the ledger with
``PrivacyLedger.record_post_processing``).

``train_central(loss_fn, params, data, ...)`` runs ``steps`` minibatch steps over ``data`` (a
dict of arrays with a shared leading example axis, e.g. ``{'tokens': int32[N, L+1]}`` plus
``topk_ids``/``topk_logits`` for distillation), reshuffling every epoch with an explicit seed;
it is resumable from ``workdir``: params, optimizer state, step and history are committed
atomically with the engine's checkpoint mechanism (``fedpriv.fl.checkpoint``: one orbax commit,
keep-N, integrity-checked), with a fingerprint (seed, batch size, a digest of the data, the
caller's ``fingerprint`` fields) that a resumed run must match.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from fedpriv.fl.checkpoint import CHECKPOINTS, EXTRA_PREFIX, Checkpointer, CheckpointError, check_fingerprint, json_safe

LEGACY_FILES = ("central.msgpack", "central_history.json")  # the old two-file format


def adam_with_clipping(learning_rate: float = 1e-3, clip: float | None = 1.0) -> optax.GradientTransformation:
    """Adam (App. B.2: lr 1e-3) with gradient clipping by global norm."""
    parts = ([optax.clip_by_global_norm(clip)] if clip else []) + [optax.adam(learning_rate)]
    return optax.chain(*parts)


def _batch_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Indices of minibatch ``step``: epoch-wise permutations, a pure function of (seed, step)."""
    per_epoch = max(1, n // batch_size)
    epoch, pos = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[pos * batch_size:(pos + 1) * batch_size]


def _data_digest(data: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(data):
        a = np.ascontiguousarray(data[k])
        h.update(f"{k}{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def _step_fn(loss_fn: Callable, optimizer: optax.GradientTransformation) -> Callable:
    """The jitted optimizer step of (loss_fn, optimizer), one per pair: calls of `train_central`
    with the same loss and optimizer objects share its compilations."""
    @jax.jit
    def step_fn(params, opt_state, batch, rng):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step_fn


def _central_checkpoint(workdir: str, keep: int, params, opt_state, fp: dict, resume_anyway,
                        steps: int):
    """``(Checkpointer, None or (step, params, opt_state, history))``: the central run's
    checkpoint in ``workdir``, refused if another run (``fp``) or past ``steps`` wrote it."""
    if not os.path.isdir(os.path.join(workdir, CHECKPOINTS)) and any(
            os.path.exists(os.path.join(workdir, f)) for f in LEGACY_FILES):
        raise CheckpointError(f"{workdir} holds a central checkpoint in the old two-file format; "
                              "use another workdir")
    ckpt = Checkpointer(os.path.join(workdir, CHECKPOINTS), keep)
    template = {"params": params, "opt_state": opt_state, "step": np.zeros((), np.int32)}
    loaded = ckpt.restore(template)
    if loaded is None:
        return ckpt, None
    state, meta = loaded
    check_fingerprint(meta.get("fingerprint", {}), fp, resume_anyway,
                      f"central checkpoint in {workdir!r}", lambda k: True)
    start = int(state["step"])
    if start != meta.get("step") or start > steps:
        raise CheckpointError(f"central checkpoint in {workdir!r} is at step {start} "
                              f"(metadata {meta.get('step')}), steps={steps}")
    return ckpt, (start, state["params"], state["opt_state"], list(meta["history"]))


def train_central(loss_fn: Callable, params, data: Mapping[str, np.ndarray], *, steps: int,
                  batch_size: int, seed: int, optimizer: optax.GradientTransformation | None = None,
                  workdir: str | None = None, checkpoint_every: int = 500, keep_checkpoints: int = 2,
                  fingerprint: Mapping | None = None, resume_anyway: Sequence[str] = (),
                  eval_fn: Callable | None = None, eval_every: int = 0, progress: bool = True,
                  desc: str = "public training", log: Callable[[str], None] | None = print):
    """Minibatch training of ``loss_fn(params, batch, rng) -> (loss, aux)`` on ``data``.

    Args:
      data: dict of arrays ``[N, ...]`` (N >= batch_size); each batch also gets
        ``mask: float32[B]`` = 1 as the engine's loss contract expects.
      steps: number of optimizer steps (resumes from ``workdir`` if it holds a checkpoint).
      optimizer: default ``adam_with_clipping()``.
      fingerprint: the caller's config fields (e.g. learning rate) a resumed run must match, with
        seed, batch size and the data's digest; ``resume_anyway`` names fields allowed to differ.

    Returns:
      ``(params, history)`` with ``history`` a list of ``{'step', 'loss', ...eval}`` rows.
    """
    n = len(next(iter(data.values())))
    if n == 0:
        raise ValueError("public training data is empty")
    if any(len(v) != n for v in data.values()):
        raise ValueError("all arrays in data must share the leading example axis")
    if steps < 0 or batch_size < 1:
        raise ValueError(f"need steps >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    batch_size = min(batch_size, n)
    optimizer = optimizer or adam_with_clipping()
    opt_state = optimizer.init(params)
    start, history = 0, []
    batch_size = int(batch_size)
    fp = json_safe({"seed": int(seed), "batch_size": batch_size, "data": _data_digest(data),
                    **{EXTRA_PREFIX + str(k): v for k, v in (fingerprint or {}).items()}})
    ckpt, loaded = None, None
    if workdir:
        ckpt, loaded = _central_checkpoint(workdir, keep_checkpoints, params, opt_state, fp,
                                           resume_anyway, steps)
    loaded_any = loaded is not None
    if loaded_any:
        start, params, opt_state, history = loaded
        if log is not None:
            log(f"{desc}: resumed {workdir} at step {start} of {steps}")

    step_fn = _step_fn(loss_fn, optimizer)
    saved_at = [start if loaded_any else None]

    def save(step):
        saved_at[0] = step
        if ckpt is not None:
            ckpt.save({"params": params, "opt_state": opt_state, "step": np.asarray(step, np.int32)},
                      {"step": step, "history": history, "fingerprint": fp})

    key = jax.random.key(seed)
    ones = jnp.ones((batch_size,), jnp.float32)
    bar = tqdm(range(start, steps), initial=start, total=steps, disable=not progress, desc=desc,
               dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30.0)
    for s in bar:
        idx = _batch_indices(n, batch_size, s, seed)
        batch = {k: jnp.asarray(v[idx]) for k, v in data.items()}
        batch["mask"] = ones
        params, opt_state, loss = step_fn(params, opt_state, batch, jax.random.fold_in(key, s))
        row = {"step": s + 1, "loss": float(loss)}
        if eval_fn is not None and eval_every and ((s + 1) % eval_every == 0 or s + 1 == steps):
            row.update({f"eval_{k}": v for k, v in eval_fn(params).items()})
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", refresh=False)
        if checkpoint_every and (s + 1) % checkpoint_every == 0:
            save(s + 1)
    bar.close()
    if saved_at[0] != steps:
        save(steps)
    if ckpt is not None:
        ckpt.close()
    return params, history
