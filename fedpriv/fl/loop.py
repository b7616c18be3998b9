"""The one generic round loop (DESIGN.md principle 7).

sampling (host, NumPy) -> padded cohort -> jitted round (vmapped client updates, clipping,
aggregation, noise, server optimizer) -> metrics (JSON lines) -> eval every k rounds ->
checkpoint every k rounds. Experiments assemble pieces and call ``train``; they never copy it.

Before the first round, the run's whole privacy cost (``privacy_event`` for all rounds) is
spent in the ledger — refused before any private data is touched if it would exceed the
budget. Checkpoints hold params, optimizer, noise and clip state (with their PRNG keys), the
round, and the ledger; sampling and round keys are pure functions of (seed, round), so a
resumed run reproduces an uninterrupted one exactly.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from tqdm.auto import tqdm

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.algorithms import FederatedAlgorithm, ServerState
from fedpriv.fl.execution import CohortExecutor, replicate
from fedpriv.fl.samplers import PoissonSampler

CHECKPOINT = "checkpoint.msgpack"
META = "checkpoint.json"
METRICS = "metrics.jsonl"


def _is_key(x):
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_host(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(jax.random.key_data(x) if _is_key(x) else x), tree)


def _from_host(tree, template):
    return jax.tree_util.tree_map(
        lambda x, t: jax.random.wrap_key_data(jnp.asarray(x), impl=jax.random.key_impl(t))
        if _is_key(t) else jnp.asarray(x, dtype=t.dtype), tree, template)


def save_checkpoint(workdir: str, state: ServerState, ledger: PrivacyLedger | None, extra: dict | None = None):
    """Atomically write the server state and metadata (round, ledger, extra) to ``workdir``."""
    os.makedirs(workdir, exist_ok=True)
    blob = serialization.to_bytes(_to_host(state))
    tmp = os.path.join(workdir, CHECKPOINT + ".tmp")
    with open(tmp, "wb") as f:
        f.write(blob)
    meta = {"round": int(state.round), "ledger": ledger.to_dict() if ledger else None,
            "extra": extra or {}, "time": time.time()}
    tmpm = os.path.join(workdir, META + ".tmp")
    with open(tmpm, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(workdir, CHECKPOINT))
    os.replace(tmpm, os.path.join(workdir, META))


def load_checkpoint(workdir: str, template: ServerState):
    """Returns ``(state, ledger_or_None, meta)`` or ``None`` if ``workdir`` has no checkpoint."""
    path = os.path.join(workdir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        host = serialization.from_bytes(_to_host(template), f.read())
    with open(os.path.join(workdir, META)) as f:
        meta = json.load(f)
    ledger = PrivacyLedger.from_dict(meta["ledger"]) if meta.get("ledger") else None
    return _from_host(host, template), ledger, meta


def replace_params(workdir: str, template: ServerState, fn: Callable, ledger_note: str | None = None):
    """Replace the params of ``workdir``'s checkpoint by ``fn(params)``; everything else (round,
    optimizer, noise/tree and clip state, sampler position, ledger) continues unchanged.

    Used for Wang et al.'s public mid-training (Algorithm 1 step 4) between rounds T' and T:
    training the DP checkpoint on public data is post-processing, recorded in the ledger as
    such (``ledger_note``) at zero privacy cost. Returns the new params.
    """
    loaded = load_checkpoint(workdir, template)
    if loaded is None:
        raise FileNotFoundError(f"no checkpoint in {workdir!r} to continue from")
    state, ledger, meta = loaded
    new_params = fn(state.params)
    if jax.tree_util.tree_structure(new_params) != jax.tree_util.tree_structure(state.params):
        raise ValueError("fn changed the parameter structure; the run cannot continue")
    if ledger is not None and ledger_note:
        ledger.record_post_processing(ledger_note)
    save_checkpoint(workdir, state.replace(params=new_params), ledger, meta.get("extra"))
    return new_params


def _scalarize(metrics) -> dict:
    out = {}
    for k, v in metrics.items():
        v = np.asarray(v)
        out[k] = float(v) if v.size == 1 else v.tolist()
    if "loss_sum" in out and out.get("num_tokens"):
        out["train_loss"] = out["loss_sum"] / out["num_tokens"]
    denom = out.get("num_acc_tokens", out.get("num_tokens"))
    if "num_correct" in out and denom:
        out["train_accuracy"] = out["num_correct"] / denom
    return out


@dataclasses.dataclass
class TrainResult:
    state: ServerState
    ledger: PrivacyLedger | None
    history: list
    evals: list
    resumed_from: int


def train(algorithm: FederatedAlgorithm, init_params, dataset: Mapping, client_ids: Sequence,
          sampler, *, rounds: int, batch_size: int, seed: int, workdir: str | None = None,
          max_steps: int | None = None, eval_fn: Callable | None = None, eval_every: int = 0,
          checkpoint_every: int = 0, ledger: PrivacyLedger | None = None, privacy_event=None,
          ledger_name: str = "fl-training", populations=("users",), mesh=None,
          lanes: str | int = "auto", progress: bool = True, stop_after: int | None = None,
          log_fn: Callable[[dict], None] | None = None) -> TrainResult:
    """Run ``rounds`` rounds of ``algorithm`` (resuming from ``workdir`` if it has a checkpoint).

    Args:
      algorithm: from ``fedpriv.fl.algorithms``.
      init_params: initial model parameters (round 0).
      dataset: client id -> dict of example arrays; ``client_ids[i]`` is population member i.
      sampler: host-side sampler over ``range(len(client_ids))``.
      rounds: total rounds (including those done before a resume).
      batch_size, max_steps: local batching (see ``cohort.build_cohort``).
      seed: root seed; the state's key is ``key(seed)``; round r uses ``fold_in(key, r)``.
      workdir: where ``metrics.jsonl`` and checkpoints go (None: nothing written).
      eval_fn: ``params -> dict`` of metrics, run every ``eval_every`` rounds and at the end.
      ledger, privacy_event: if given, ``privacy_event`` (for all ``rounds``) is spent in the
        ledger before round 0 under ``ledger_name``/``populations``; refused = nothing runs.
      mesh: a ``clients`` mesh to shard the cohort's lanes over (``aggregate.client_mesh``);
        under ``jax.distributed`` each process builds only its own lanes.
      lanes: clients trained concurrently: ``"auto"`` (backend default, see
        ``fedpriv.fl.execution``), ``"balanced"`` or an int.
      stop_after: stop (with a checkpoint) after this many rounds *in this call* — used to
        simulate an interruption.
    """
    if len(client_ids) != getattr(sampler, "num_clients", len(client_ids)):
        raise ValueError(f"sampler population {sampler.num_clients} != {len(client_ids)} client ids")
    root = jax.random.key(seed)
    k_init, k_rounds = jax.random.split(root)
    state = algorithm.init(init_params, k_init)
    start, history, evals = 0, [], []
    resumed = workdir is not None and load_checkpoint(workdir, state) is not None
    if resumed:
        state, saved_ledger, meta = load_checkpoint(workdir, state)
        start = int(meta["round"])
        if saved_ledger is not None:
            ledger = saved_ledger
        _truncate_metrics(workdir, start)
    elif ledger is not None and privacy_event is not None:
        ledger.spend(ledger_name, privacy_event, populations)  # raises before any data is read
    executor = CohortExecutor(algorithm, dataset, batch_size=batch_size, max_steps=max_steps,
                              capacity=int(getattr(sampler, "max_cohort_size")),
                              variable_cohort=isinstance(sampler, PoissonSampler), lanes=lanes, mesh=mesh)
    executor.set_params_size(init_params)
    state = replicate(state, mesh)
    log_path = os.path.join(workdir, METRICS) if workdir else None
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    end = rounds if stop_after is None else min(rounds, start + stop_after)
    bar = tqdm(range(start, end), initial=start, total=rounds, disable=not progress, desc="rounds",
               dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30.0)
    for r in bar:
        ids = [client_ids[i] for i in sampler.sample(r)]
        # an empty (Poisson) cohort still runs: the noisy zero sum is released, as accounted
        packed = executor.pack(ids, rng=np.random.default_rng([seed, r]))
        state, metrics = executor.run(state, packed, jax.random.fold_in(k_rounds, r))
        row = {"round": r + 1, **_scalarize(metrics), "real_steps": packed.real_steps,
               "executed_steps": packed.executed_steps}
        if "train_loss" in row:
            bar.set_postfix(loss=f"{row['train_loss']:.3f}", refresh=False)
        if eval_fn is not None and ((eval_every and (r + 1) % eval_every == 0) or r + 1 == rounds):
            ev = {"round": r + 1, **{f"eval_{k}": v for k, v in eval_fn(state.params).items()}}
            if ledger is not None:
                ev["epsilon_spent"] = ledger.spent()
            row.update(ev)
            evals.append(ev)
        history.append(row)
        if log_fn is not None:
            log_fn(row)
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if workdir and ((checkpoint_every and (r + 1) % checkpoint_every == 0) or r + 1 == end):
            save_checkpoint(workdir, state, ledger)
    bar.close()
    return TrainResult(state, ledger, history, evals, start)


def _truncate_metrics(workdir: str, last_round: int) -> None:
    """Drop metric rows past the checkpoint (they are recomputed identically on resume)."""
    path = os.path.join(workdir, METRICS)
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip() and json.loads(line)["round"] <= last_round]
    with open(path + ".tmp", "w") as f:
        f.writelines(rows)
    os.replace(path + ".tmp", path)
