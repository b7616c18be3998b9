"""The one generic round loop (docs/design.md §1.7): ``train``.

Per round: sample the cohort (host, NumPy) -> pack the clients into lanes of real local steps
(``fedpriv.fl.cohort``) -> one jitted round (``algorithm.apply``: client hooks, clipping, the
clipped sum, the mechanism's noise, the server update) -> a metrics row (``metrics.jsonl``,
``fedpriv.fl.metrics_log``; DP-covered or ``nonprivate/`` keys, ``fedpriv.fl.outputs``) ->
evaluation every k rounds -> a checkpoint every k rounds (``fedpriv.fl.run_records``).
Experiments assemble pieces and call ``train``; they never copy it.

Privacy (docs/design.md §3): the loop derives the event of what it runs,
``algorithms.privacy_event(algorithm.dp, sampler, rounds)``, and spends it in the ledger under
the run's ``stage`` name before round 0 -- refused (``PrivacyBudgetExceeded``) before any
private data is touched. A private algorithm never runs without a ledger unless the caller says
``nonprivate_ok=True`` (the run is then unaccounted, and its checkpoints say so). Before anything
is charged, one round is traced abstractly (``jax.eval_shape``: no compilation, no data), so a
bug in user code raises before the ledger is charged. The algorithm's ``expected_cohort_size``
must equal the sampler's, which the accounting uses.

Resuming from a checkpoint fails closed (``fedpriv.fl.resume``): another fingerprint, a missing
ledger, a damaged commit whose fallback would under-report the spend are refused; more rounds
are charged or refused. Sampling and round keys are pure functions of (seed, stage, round), so
a resumed run reproduces an uninterrupted one bit for bit; the root key is
``tagged_key(seed, stage, ...)``. One writer per workdir (``fedpriv.fl.workdir``): a second
process is refused in one line; a failed write is a one-line ``WorkdirError`` /
``CheckpointWriteError`` and keeps what was written.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from fedpriv.data.errors import ConfigError
from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.dp.noise import check_int
from fedpriv.errors import FedprivError
from fedpriv.fl import inputs, workdir as wdlock
from fedpriv.fl.algorithms import FederatedAlgorithm, ServerState, privacy_event
from fedpriv.fl.checkpoint import CheckpointError, CheckpointWriteError, ResumeMismatch, json_safe
from fedpriv.fl.client_state import ClientStateStore
from fedpriv.fl.execution import CohortExecutor, replicate
from fedpriv.fl.metrics_log import METRICS, append_row, dumps_row, read_metrics
from fedpriv.fl.outputs import (
    DERIVED_METRICS,
    DP_COVERED_METRICS,
    NONPRIVATE,
    OUTPUTS,
    PUBLIC_METRICS,
    nonprivate_key,
    scalarize,
)
from fedpriv.fl.resume import resume, tidy_workdir
from fedpriv.fl.run_records import (
    TRAINING_FIELDS,
    PrivacyAccountingError,
    RunCheckpoint,
    checkpoint_round,
    checkpointer,
    commit,
    describe,
    fork_run,
    load_run,
    lock_name,
    read_checkpoint,
    replace_params,
    run_fingerprint,
)
from fedpriv.fl.samplers import check_sampler
from fedpriv.fl.workdir import WorkdirError, WorkdirLocked

# (the run records, the metrics log and the output classification live in their own modules;
# their public names stay importable from here)
__all__ = ["train", "TrainResult", "RunCheckpoint", "load_run", "replace_params", "fork_run",
           "checkpoint_round", "read_metrics", "dumps_row", "run_fingerprint", "METRICS",
           "DERIVED_METRICS", "NONPRIVATE", "DP_COVERED_METRICS", "PUBLIC_METRICS", "OUTPUTS",
           "nonprivate_key", "TRAINING_FIELDS", "CheckpointError", "CheckpointWriteError",
           "ResumeMismatch", "PrivacyAccountingError", "WorkdirError", "WorkdirLocked"]


@dataclasses.dataclass
class TrainResult:
    """``event``: the event charged for this run (None if non-private or unaccounted);
    ``executed_event``: with ``noise_cohort_size``, the event of the run actually executed."""
    state: ServerState
    ledger: PrivacyLedger | None
    history: list
    evals: list
    resumed_from: int
    event: object = None
    executed_event: object = None
    charged_rounds: int = 0
    # damaged commits passed over on resume ([(commit, reason)]); rounds without a metrics row
    fell_back: list = dataclasses.field(default_factory=list)
    metrics_gaps: list = dataclasses.field(default_factory=list)
    # for client hooks that keep client state: every client's state ([N, ...], population order)
    client_states: object = None


def _entry_details(dp, sampler, rounds: int, executed_event) -> dict:
    d = {"rounds": int(rounds), "sampler": describe(sampler), "mechanism": dp.mechanism,
         "noise_multiplier": dp.noise_multiplier, "clip_norm": dp.clip_norm,
         "adaptive_clipping": dp.adaptive is not None}
    if dp.noise_cohort_size is not None:
        d.update(noise_cohort_size=dp.noise_cohort_size, simulated_population=True,
                 executed_event=event_to_json(executed_event))
    return json_safe(d)


def train(algorithm: FederatedAlgorithm, init_params, dataset: Mapping, client_ids: Sequence,
          sampler, *, rounds: int, batch_size: int, seed: int,
          ledger: PrivacyLedger | None = None, nonprivate_ok: bool = False,
          stage: str = "fl-training", populations=("users",), workdir: str | None = None,
          fingerprint: Mapping | None = None, resume_anyway: Sequence[str] = (),
          max_steps: int | None = None, eval_fn: Callable | None = None, eval_every: int = 0,
          checkpoint_every: int = 0, keep_checkpoints: int = 2, mesh=None,
          lanes: str | int = "auto", batching: str = "padded", progress: bool = True,
          stop_after: int | None = None,
          log_fn: Callable[[dict], None] | None = None,
          derived_metrics: Mapping = DERIVED_METRICS,
          log: Callable[[str], None] | None = print) -> TrainResult:
    """Run ``rounds`` rounds of ``algorithm`` (resuming from ``workdir`` if it has a checkpoint).

    Args:
      algorithm: from ``fedpriv.fl.algorithms``.
      init_params: initial model parameters (round 0).
      dataset: client id -> dict of example arrays; ``client_ids[i]`` is population member i.
      sampler: host-side sampler over ``range(len(client_ids))``; its ``expected_cohort_size``
        must equal ``algorithm.expected_cohort_size`` (else ``ConfigError``: the noise and the
        accounting would assume different cohorts).
      rounds: total rounds (including those done before a resume).
      batch_size, max_steps: local batching (see ``cohort.pack_cohort``).
      seed: root seed; keys are ``tagged_key(seed, stage, "init" | "rounds")``, round r uses
        ``fold_in(rounds_key, r)``.
      ledger: the pipeline's ``PrivacyLedger``. For a private algorithm the loop spends
        ``privacy_event(algorithm.dp, sampler, rounds)`` in it under ``stage`` before round 0
        (refused = nothing runs); on resume the checkpoint's ledger is merged into it (or used,
        if ``ledger`` is None). A non-private algorithm takes no ledger.
      nonprivate_ok: allow a private algorithm to run with no ledger (unaccounted: nothing it
        outputs is covered by a privacy guarantee); without it that raises
        ``PrivacyAccountingError``.
      stage: the run's name: ledger entry, PRNG key tag, fingerprint field. Give every train()
        call on the same users its own stage (same seed + other stage = independent noise).
      populations: the ledger populations this run touches.
      workdir: where ``metrics.jsonl`` and checkpoints go (None: nothing written). Held
        exclusively for the call (``fedpriv.fl.workdir``; re-entrant within the process): a
        second process is refused with ``WorkdirLocked`` naming the holder; a workdir that is
        a file or not writable, and a failed write (disk full), raise ``WorkdirError`` /
        ``CheckpointWriteError`` in one line, keeping what was written.
      fingerprint: the caller's own config fields a resumed run must match (e.g. learning
        rates, corpus); with the loop's fields (``run_fingerprint``).
      resume_anyway: fields allowed to differ on resume (only ``TRAINING_FIELDS`` and the
        caller's ``fingerprint`` fields; privacy fields never).
      eval_fn: ``params -> dict`` of metrics, run every ``eval_every`` rounds and at the end.
      checkpoint_every, keep_checkpoints: commit every k rounds (and at the end), keep N.
      mesh: a ``clients`` mesh to shard the cohort's lanes over (``aggregate.client_mesh``);
        under ``jax.distributed`` each process builds only its own lanes.
      lanes: clients trained concurrently: ``"auto"`` (backend default, see
        ``fedpriv.fl.execution``), ``"balanced"`` or an int.
      batching: local batches ``"padded"``, ``"trimmed"``, ``"sorted"`` by length,
        ``"packed"`` (``fedpriv.fl.cohort``, "Length-aware batches") or ``"auto"`` (packed on
        one sequential lane, else padded; ``fedpriv.fl.execution``).
      stop_after: stop (with a checkpoint) after this many rounds *in this call* — used to
        simulate an interruption.
      derived_metrics: ratios written per round, ``{name: (sum, (count, ...))}``
        (default ``DERIVED_METRICS``: the LM tasks' train loss and accuracy).
      log: where resume messages go (None: silent).
    """
    args = dict(locals())
    _check_args(algorithm, sampler, client_ids, rounds, stage, dataset=dataset, init_params=init_params,
                seed=seed, batch_size=batch_size, max_steps=max_steps, eval_every=eval_every,
                checkpoint_every=checkpoint_every)
    if workdir is None:
        return _train(**args)
    with wdlock.locked(workdir, lock_name()):  # one writer per workdir (re-entrant)
        return _train(**args)


def _check_args(algorithm, sampler, client_ids, rounds, stage, *, dataset, init_params, seed,
                batch_size, max_steps, eval_every, checkpoint_every) -> None:
    if not isinstance(algorithm, FederatedAlgorithm):
        raise inputs.TrainInputError(f"algorithm must be a FederatedAlgorithm (fedpriv.fl.algorithms."
                                     f"build_algorithm), got {type(algorithm).__name__}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    inputs.check_seed(seed)
    check_int("batch_size", batch_size)
    if max_steps is not None:
        check_int("max_steps", max_steps)
    check_int("eval_every", eval_every, 0)
    check_int("checkpoint_every", checkpoint_every, 0)
    inputs.check_client_ids(dataset, client_ids)
    inputs.check_examples(dataset, client_ids)
    inputs.check_params(init_params)
    if not isinstance(stage, str) or not stage:
        raise ValueError(f"stage must be a non-empty string, got {stage!r}")
    check_sampler(sampler)
    if len(client_ids) != sampler.num_clients:
        raise ValueError(f"sampler population {sampler.num_clients} != {len(client_ids)} client ids")
    have, want = float(algorithm.expected_cohort_size), sampler.expected_cohort_size
    if not math.isclose(have, float(want), rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"stage {stage!r}: the algorithm was built for expected_cohort_size={have:g} but the "
            f"sampler draws {float(want):g} clients per round (the noise and the update would "
            f"follow one, the accounting the other); build it with "
            f"expected_cohort_size=sampler.expected_cohort_size")


def _run_rounds(executor, state, sampler, client_ids, *, seed, key, start, end, rounds, eval_fn,
                eval_every, ledger, log_fn, derived_metrics, workdir, checkpoint_every, ckpt, charged,
                accounted, fp, progress, store=None):
    """Rounds ``start..end-1``: sample, pack, run, evaluate, log, checkpoint. Returns
    ``(state, history, evals)`` of the rounds run here."""
    history, evals = [], []
    log_path = os.path.join(workdir, METRICS) if workdir else None
    bar = tqdm(range(start, end), initial=start, total=rounds, disable=not progress, desc="rounds",
               dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30.0)
    for r in bar:
        idx = sampler.sample(r)
        ids = [client_ids[i] for i in idx]
        # an empty (Poisson) cohort still runs: the noisy zero sum is released, as accounted
        packed = executor.pack(ids, rng=np.random.default_rng([seed, r]))
        if store is None:
            state, metrics = executor.run(state, packed, jax.random.fold_in(key, r))
        else:  # the sampled clients' own states, by slot, and back to them
            state, metrics, new = executor.run(state, packed, jax.random.fold_in(key, r),
                                               store.gather(idx, packed.client_mask.shape[0]))
            store.scatter(idx, new)
        row = {"round": r + 1, **scalarize({**metrics, "real_steps": packed.real_steps,
                                             "executed_steps": packed.executed_steps}, derived_metrics)}
        if NONPRIVATE + "train_loss" in row:
            bar.set_postfix(loss=f"{row[NONPRIVATE + 'train_loss']:.3f}", refresh=False)
        if eval_fn is not None and ((eval_every and (r + 1) % eval_every == 0) or r + 1 == rounds):
            got = eval_fn(state.params)
            if not isinstance(got, Mapping):
                raise inputs.TrainInputError(f"eval_fn must return a dict of metrics, got {type(got).__name__}")
            ev = {"round": r + 1, **{f"eval_{k}": v for k, v in got.items()}}
            if ledger is not None:
                ev["epsilon_spent"] = ledger.spent()
            row.update(ev)
            evals.append(ev)
        history.append(row)
        if log_fn is not None:
            log_fn(row)
        if log_path:
            append_row(log_path, row)
        if workdir and ((checkpoint_every and (r + 1) % checkpoint_every == 0) or r + 1 == end):
            commit(ckpt, _tree(state, store), ledger, charged_rounds=charged, accounted=accounted,
                   fingerprint=fp)
    bar.close()
    return state, history, evals


def _train(algorithm, init_params, dataset, client_ids, sampler, *, rounds, batch_size, seed,
           ledger, nonprivate_ok, stage, populations, workdir, fingerprint, resume_anyway,
           max_steps, eval_fn, eval_every, checkpoint_every, keep_checkpoints, mesh, lanes,
           batching, progress, stop_after, log_fn, derived_metrics, log) -> TrainResult:
    rounds = int(rounds)
    dp = algorithm.dp
    private = dp.is_private
    if not private and ledger is not None:
        raise PrivacyAccountingError(
            f"stage {stage!r}: the algorithm is not private (z={dp.noise_multiplier}, clip "
            f"{dp.clip_norm}): its epsilon is infinite and cannot be charged; pass ledger=None")
    populations = tuple(populations)
    # the event of what runs, from the objects that run (raises on a mismatched sampler)
    event = privacy_event(dp, sampler, rounds) if private else None
    executed = (privacy_event(dp, sampler, rounds, simulated=False)
                if private and dp.noise_cohort_size is not None else None)
    details = (lambda n: _entry_details(dp, sampler, n, privacy_event(dp, sampler, n, simulated=False)
                                        if dp.noise_cohort_size is not None else None))
    ckpt = checkpointer(workdir, keep_checkpoints) if workdir else None
    k_init, k_rounds = tagged_key(seed, stage, "init"), tagged_key(seed, stage, "rounds")
    state = algorithm.init(init_params, k_init)
    store = (ClientStateStore(algorithm.client.state_init(init_params), len(client_ids))
             if algorithm.stateful_clients else None)
    fp = run_fingerprint(algorithm, sampler, dataset, client_ids, seed=seed, stage=stage,
                         populations=populations, batch_size=batch_size, max_steps=max_steps,
                         extra=fingerprint)
    saved = read_checkpoint(ckpt, _tree(state, store)) if ckpt is not None else None
    start, charged = 0, rounds
    capacity = int(sampler.max_cohort_size)
    dry_run = lambda st: _dry_run(algorithm, st, dataset, client_ids, batch_size, capacity,
                                  k_rounds, store)
    if saved is not None:
        state, start, charged, ledger = resume(
            saved, ckpt, workdir, fp, resume_anyway, rounds=rounds, private=private, ledger=ledger,
            nonprivate_ok=nonprivate_ok, stage=stage, event=event, populations=populations,
            details=details, dry_run=dry_run, log=log)
        state = _untree(state, store)
    elif private and ledger is None and not nonprivate_ok:
        raise PrivacyAccountingError(
            f"stage {stage!r}: a private algorithm needs a PrivacyLedger to charge its cost "
            "(or nonprivate_ok=True to run unaccounted)")
    elif private and ledger is not None:
        if ledger.entry(stage) is not None:
            raise PrivacyAccountingError(f"the ledger already has an entry {stage!r}: give each "
                                         "train() call its own stage")
        dry_run(state)  # a bug in user code surfaces before anything is charged
        ledger.spend(stage, event, populations, note=f"{rounds} rounds", details=details(rounds))
    else:
        dry_run(state)  # parameters that do not fit the model: one line, before round 0
    accounted = private and ledger is not None
    if accounted and charged != rounds:  # resumed with fewer rounds than charged: report the charge
        event = privacy_event(dp, sampler, charged)
        executed = privacy_event(dp, sampler, charged, simulated=False) if executed is not None else None
    if accounted and charged < rounds:  # never, by construction: every round run is charged
        raise PrivacyAccountingError(f"stage {stage!r}: {rounds} rounds but {charged} charged")
    gaps = tidy_workdir(workdir, ckpt, saved, start, stage, log) if workdir else []
    executor = CohortExecutor(algorithm, dataset, batch_size=batch_size, max_steps=max_steps,
                              capacity=capacity,
                              variable_cohort=bool(sampler.variable_cohort),
                              lanes=lanes, mesh=mesh, batching=batching)
    executor.set_params_size(init_params)
    state = replicate(state, mesh)
    end = rounds if stop_after is None else min(rounds, start + stop_after)
    state, history, evals = _run_rounds(
        executor, state, sampler, client_ids, seed=seed, key=k_rounds, start=start, end=end,
        rounds=rounds, eval_fn=eval_fn, eval_every=eval_every, ledger=ledger, log_fn=log_fn,
        derived_metrics=derived_metrics, workdir=workdir, checkpoint_every=checkpoint_every,
        ckpt=ckpt, charged=charged, accounted=accounted, fp=fp, progress=progress, store=store)
    if ckpt is not None:
        ckpt.close()
    return TrainResult(state, ledger, history, evals, start, event if accounted else None,
                       executed if accounted else None, charged,
                       list(saved.skipped) if saved is not None else [], gaps,
                       None if store is None else store.table)


def _tree(state, store):
    """What a checkpoint holds: the server state, and the clients' states if they keep any."""
    return state if store is None else {"server": state, "clients": store.table}


def _untree(tree, store):
    """The server state of a checkpoint's ``tree`` (``_tree``); the clients' states go back
    into ``store``."""
    if store is None:
        return tree
    store.table = jax.tree_util.tree_map(lambda a: np.array(a), tree["clients"])
    return tree["server"]


def _dry_run(algorithm, state, dataset, client_ids, batch_size: int, capacity: int, key,
             store=None) -> None:
    """Trace one round abstractly (``jax.eval_shape`` of ``algorithm.apply`` on a padded
    ``[capacity, 1, batch_size, ...]`` cohort of the dataset's example shapes and dtypes): the
    clients' local steps (the caller's ``loss_fn``), clipping, noise and the server update, with
    no compilation and no data values. Raises what user code raises."""
    if not client_ids or algorithm.apply is None:
        return
    first = dataset[client_ids[0]]
    batch = {k: jax.ShapeDtypeStruct((capacity, 1, batch_size) + np.shape(v)[1:], np.asarray(v[:1]).dtype)
             for k, v in first.items()}
    batch["mask"] = jax.ShapeDtypeStruct((capacity, 1, batch_size), np.float32)
    mask = jax.ShapeDtypeStruct((capacity,), np.float32)
    server = state["server"] if isinstance(state, dict) else state
    try:
        if store is None:
            jax.eval_shape(algorithm.apply, state, batch, mask, key)
            return
        states = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((capacity,) + x.shape, x.dtype),
                                        store.initial)
        jax.eval_shape(lambda st, b, m, k, cs: algorithm.apply(st, b, m, k, None, cs), server, batch,
                       mask, key, states)
    except (TypeError, ValueError, KeyError, IndexError) as err:
        if isinstance(err, FedprivError):
            raise
        raise inputs.describe_trace_error(err, server.params, client_ids[0], first) from err
