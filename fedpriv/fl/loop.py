"""The one generic round loop (docs/design.md §1.7).

sampling (host, NumPy) -> padded cohort -> jitted round (vmapped client updates, clipping,
aggregation, noise, server optimizer) -> metrics (JSON lines) -> eval every k rounds ->
checkpoint every k rounds. Experiments assemble pieces and call ``train``; they never copy it.

Privacy (docs/design.md §3): the loop derives the event of what it runs,
``algorithms.privacy_event(algorithm.dp, sampler, rounds)``, and spends it in the ledger under
the run's ``stage`` name before round 0 — refused (``PrivacyBudgetExceeded``) before any
private data is touched. A private algorithm never runs without a ledger unless the caller says
``nonprivate_ok=True`` (the run is then unaccounted, and its checkpoints say so).

Checkpoints (``fedpriv.fl.checkpoint``: one atomic orbax commit, keep-N) hold the server state
(params, optimizer, noise and clip state with their PRNG keys), the round, the ledger, the
rounds charged and the run's config fingerprint. Resuming:

- refuses a checkpoint whose fingerprint differs (naming the fields); ``resume_anyway`` may
  name only fields that do not change privacy (``TRAINING_FIELDS`` and the caller's own
  ``fingerprint`` fields);
- carries the recorded cost: the checkpoint's ledger is merged into the caller's
  (``PrivacyLedger.absorb``) or used as is; more rounds than were charged replace the run's
  entry by the event of the new total schedule (checked against the budget before any round
  runs); a private run whose checkpoint has no ledger is refused (unless ``nonprivate_ok``);
- truncates ``metrics.jsonl`` to the checkpoint's round (dropping a torn last line), so the log
  holds exactly one row per round after any sequence of crashes.

Sampling and round keys are pure functions of (seed, stage, round), so a resumed run reproduces
an uninterrupted one bit for bit. Keys carry their purpose: the root key is
``tagged_key(seed, stage, ...)``, so two runs with one seed and different stages draw
independent noise.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.fl.algorithms import FederatedAlgorithm, ServerState, privacy_event
from fedpriv.fl.checkpoint import (CHECKPOINTS, EXTRA_PREFIX, Checkpointer, CheckpointError,
                                   ResumeMismatch, check_fingerprint, json_safe)
from fedpriv.fl.execution import CohortExecutor, replicate
from fedpriv.fl.samplers import PoissonSampler

METRICS = "metrics.jsonl"
LEGACY_FILES = ("checkpoint.msgpack", "checkpoint.json")  # the old two-file format

# Fingerprint fields that may differ on resume when named in ``resume_anyway``: they change
# the training, not the privacy (clipping bounds each user's contribution whatever they are).
# Every other loop field (stage, seed, dp, expected cohort, sampler, population, populations,
# accounting) changes the mechanism or where it is charged and can never be overridden.
TRAINING_FIELDS = ("batch_size", "max_steps", "client_sizes")


class PrivacyAccountingError(CheckpointError):
    """A private run would go unaccounted (no ledger), or its recorded cost is missing."""


__all__ = ["train", "TrainResult", "RunCheckpoint", "load_run", "replace_params", "fork_run",
           "read_metrics", "run_fingerprint", "METRICS", "DERIVED_METRICS", "NONPRIVATE", "DP_COVERED_METRICS", "PUBLIC_METRICS", "OUTPUTS",
           "nonprivate_key", "TRAINING_FIELDS", "CheckpointError",
           "ResumeMismatch", "PrivacyAccountingError"]


# ----------------------------------------------------------------------------- fingerprint
def _describe(obj) -> dict:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return json_safe({"type": type(obj).__name__, **dataclasses.asdict(obj)})
    return {"type": type(obj).__name__, "repr": repr(obj)}


def _sha(x) -> str:
    return hashlib.sha256(json.dumps(json_safe(x), sort_keys=True).encode()).hexdigest()[:16]


def _num_examples(dataset, cid) -> int:
    if hasattr(dataset, "num_examples"):
        return int(dataset.num_examples(cid))
    return int(len(next(iter(dataset[cid].values()))))


def run_fingerprint(algorithm: FederatedAlgorithm, sampler, dataset: Mapping, client_ids: Sequence,
                    *, seed: int, stage: str, populations, batch_size: int, max_steps, extra: Mapping | None = None) -> dict:
    """The identity of a run, rounds aside: what a resumed run must match.

    Privacy fields (never overridable): ``stage`` (key tag and ledger entry), ``seed``, ``dp``
    (the algorithm's ``DPConfig``), ``expected_cohort_size`` (sets the noise scale with
    ``noise_cohort_size``), ``sampler`` (kind, population, cohort/rate, seed, epoch length),
    ``population`` (digest of the client ids) and ``populations`` (ledger populations charged).
    Training fields (``TRAINING_FIELDS``): ``batch_size``, ``max_steps``,
    ``client_sizes`` (digest of the examples per client). ``extra``: the caller's own fields
    (learning rates, corpus, tokenizer, ...), stored as ``extra.<name>``.
    """
    fp = {"stage": stage, "seed": int(seed), "dp": _describe(algorithm.dp),
          "expected_cohort_size": float(algorithm.expected_cohort_size),
          "sampler": _describe(sampler), "population": _sha([str(c) for c in client_ids]),
          "populations": list(populations),
          "batch_size": int(batch_size), "max_steps": max_steps,
          "client_sizes": _sha([_num_examples(dataset, c) for c in client_ids])}
    for k, v in (extra or {}).items():
        fp[EXTRA_PREFIX + str(k)] = json_safe(v)
    return json_safe(fp)


def _check_fingerprint(saved: dict, current: dict, resume_anyway: Sequence[str], where: str):
    def overridable(k):
        return k.startswith(EXTRA_PREFIX) or k.split(".")[0] in TRAINING_FIELDS
    check_fingerprint(saved, current, resume_anyway, where, overridable)


# ----------------------------------------------------------------------------- checkpoints
@dataclasses.dataclass
class RunCheckpoint:
    """What a run's latest checkpoint holds (``state`` is None when read without a template)."""
    state: ServerState | None
    round: int
    ledger: PrivacyLedger | None
    charged_rounds: int
    accounted: bool
    fingerprint: dict
    meta: dict


def _checkpointer(workdir: str, keep: int = 2) -> Checkpointer:
    if not os.path.isdir(os.path.join(workdir, CHECKPOINTS)) and any(
            os.path.exists(os.path.join(workdir, f)) for f in LEGACY_FILES):
        raise CheckpointError(f"{workdir} holds a checkpoint in the old two-file format (not atomic, "
                              "no config fingerprint); it cannot be resumed safely: use another workdir")
    return Checkpointer(os.path.join(workdir, CHECKPOINTS), keep)


def _commit(ckpt: Checkpointer, state: ServerState, ledger: PrivacyLedger | None, *,
            charged_rounds: int, accounted: bool, fingerprint: dict) -> None:
    ckpt.save(state, {"round": int(state.round), "ledger": ledger.to_dict() if ledger else None,
                      "charged_rounds": int(charged_rounds), "accounted": bool(accounted),
                      "fingerprint": fingerprint, "time": time.time()})


def _run_checkpoint(ckpt: Checkpointer, template=None) -> RunCheckpoint | None:
    if template is None:
        meta, state = ckpt.meta(), None
        if meta is None:
            return None
    else:
        loaded = ckpt.restore(template)
        if loaded is None:
            return None
        state, meta = loaded
        if int(state.round) != int(meta["round"]):
            raise CheckpointError(f"checkpoint in {ckpt.directory}: state at round {int(state.round)} "
                                  f"but metadata says {meta['round']}; refusing it")
    try:
        ledger = PrivacyLedger.from_dict(meta["ledger"]) if meta.get("ledger") else None
        return RunCheckpoint(state, int(meta["round"]), ledger, int(meta["charged_rounds"]),
                             bool(meta["accounted"]), dict(meta["fingerprint"]), meta)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint in {ckpt.directory} has malformed metadata: {err!r}") from err


def load_run(workdir: str, template: ServerState | None = None) -> RunCheckpoint | None:
    """The latest checkpoint of the run in ``workdir`` (None if there is none).

    With ``template`` (e.g. ``algorithm.init(params, key)``) the state is restored and verified;
    without it only the metadata (round, ledger, fingerprint) is read.
    """
    return _run_checkpoint(_checkpointer(workdir), template)


def checkpoint_round(workdir: str) -> int | None:
    """The round of ``workdir``'s latest checkpoint (None if it has none)."""
    run = load_run(workdir)
    return None if run is None else run.round


def replace_params(workdir: str, template: ServerState, fn: Callable, ledger_note: str | None = None):
    """Replace the params of ``workdir``'s checkpoint by ``fn(params)``; everything else (round,
    optimizer, noise/tree and clip state, sampler position, ledger, fingerprint) continues.

    Used for Wang et al.'s public mid-training (Algorithm 1 step 4) between rounds T' and T:
    training the DP checkpoint on public data is post-processing, recorded in the ledger as
    such (``ledger_note``) at zero privacy cost. Committed atomically as a new checkpoint.
    Returns the new params.
    """
    ckpt = _checkpointer(workdir)
    run = _run_checkpoint(ckpt, template)
    if run is None:
        raise CheckpointError(f"no checkpoint in {workdir!r} to continue from")
    new_params = fn(run.state.params)
    if jax.tree_util.tree_structure(new_params) != jax.tree_util.tree_structure(run.state.params):
        raise ValueError("fn changed the parameter structure; the run cannot continue")
    if run.ledger is not None and ledger_note:
        run.ledger.record_post_processing(ledger_note)
    _commit(ckpt, run.state.replace(params=new_params), run.ledger, charged_rounds=run.charged_rounds,
            accounted=run.accounted, fingerprint=run.fingerprint)
    return new_params


def fork_run(src: str, dst: str) -> None:
    """Start ``dst`` as a copy of the run in ``src`` (checkpoints incl. ledger, metrics).

    A branch continues exactly as the source would (keys and sampling are functions of (seed,
    stage, round)), so a shared first stage is computed once. The checkpoint directory appears
    in ``dst`` in one rename, after the metrics: an interrupted fork leaves no checkpoint.
    """
    if checkpoint_round(src) is None:
        raise CheckpointError(f"no checkpoint in {src!r} to fork")
    if load_run(dst) is not None:
        raise CheckpointError(f"{dst!r} already holds a checkpoint; not forking over it")
    os.makedirs(dst, exist_ok=True)
    if os.path.exists(os.path.join(src, METRICS)):
        shutil.copy2(os.path.join(src, METRICS), os.path.join(dst, METRICS + ".fork"))
        os.replace(os.path.join(dst, METRICS + ".fork"), os.path.join(dst, METRICS))
    tmp = os.path.join(dst, CHECKPOINTS + ".fork")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(src, CHECKPOINTS), tmp,
                    ignore=shutil.ignore_patterns("*.orbax-checkpoint-tmp*"))
    shutil.rmtree(os.path.join(dst, CHECKPOINTS), ignore_errors=True)  # an empty/partial one
    os.replace(tmp, os.path.join(dst, CHECKPOINTS))


# ----------------------------------------------------------------------------- metrics log
def _read_rows(path: str) -> list[dict]:
    """Rows of a metrics log; a torn last line (a crash mid-write) is dropped."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise CheckpointError(f"{path}: line {i + 1} is not JSON (and is not the last line)")
    return rows


def read_metrics(workdir: str) -> list[dict]:
    """The rows of ``workdir``'s ``metrics.jsonl`` (one per round; a torn last line dropped)."""
    return _read_rows(os.path.join(workdir, METRICS))


def _reconcile_metrics(workdir: str, last_round: int) -> None:
    """Keep exactly one row per round up to the checkpoint's round (rows past it are recomputed
    identically on resume; none survive a fresh start); drop a torn last line."""
    path = os.path.join(workdir, METRICS)
    if not os.path.exists(path):
        return
    by_round = {}
    for row in _read_rows(path):
        if isinstance(row, dict) and isinstance(row.get("round"), int) and 1 <= row["round"] <= last_round:
            by_round[row["round"]] = row
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(by_round[r]) + "\n" for r in sorted(by_round))
    os.replace(path + ".tmp", path)


# Every per-round output of the loop is either covered by the ledger or marked non-private
# (docs/design.md §3): the keys below are functions of the DP releases (the noised adaptive-clipping
# count and the clip norm it sets); every other training metric is an exact statistic of the
# sampled private clients (clipped fraction, pre-clip norms, cohort size, non-finite updates,
# loss/accuracy sums, engine step counts) and is written as ``nonprivate/<name>``. ``round`` is
# public. Evaluation rows (``eval_*``, from the caller's ``eval_fn``) are exact statistics of
# whatever the caller evaluates on (held-out private users in the experiments): not covered,
# and listed as such in each run record (``OUTPUTS``); ``epsilon_spent`` is the ledger's.
NONPRIVATE = "nonprivate/"
DP_COVERED_METRICS = ("clip_norm", "unclipped_estimate")
# what the server observes whatever the data (DDG: which clients' messages arrived)
PUBLIC_METRICS = ("ddg_survivors", "ddg_released")
OUTPUTS = {
    "covered_by_ledger": ["model parameters / checkpoints", *DP_COVERED_METRICS],
    "public": ["round", "epsilon_spent", *PUBLIC_METRICS],
    "not_covered": [NONPRIVATE + "* (exact statistics of the sampled private clients)",
                    "eval_* (exact evaluation on held-out users)"],
}


def nonprivate_key(name: str) -> str:
    """The published name of a training metric: unchanged if DP-covered, else ``nonprivate/``."""
    keep = name in DP_COVERED_METRICS or name in PUBLIC_METRICS or name.startswith(NONPRIVATE)
    return name if keep else NONPRIVATE + name


# Ratios the loop derives from a round's summed metrics: name -> (numerator, denominators in
# order of preference). The default fits the LM tasks (``models.lm.make_lm_task``); a task
# whose loss returns other sums passes its own ``derived_metrics`` to ``train``.
DERIVED_METRICS = {"train_loss": ("loss_sum", ("num_tokens",)),
                   "train_accuracy": ("num_correct", ("num_acc_tokens", "num_tokens"))}


def _scalarize(metrics, derived: Mapping = DERIVED_METRICS) -> dict:
    out = {}
    for k, v in metrics.items():
        v = np.asarray(v)
        out[k] = float(v) if v.size == 1 else v.tolist()
    for name, (num, denoms) in derived.items():
        denom = next((out[d] for d in denoms if d in out), None)
        if num in out and denom:
            out[name] = out[num] / denom
    return {nonprivate_key(k): v for k, v in out.items()}


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


def _entry_details(dp, sampler, rounds: int, executed_event) -> dict:
    d = {"rounds": int(rounds), "sampler": _describe(sampler), "mechanism": dp.mechanism,
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
          lanes: str | int = "auto", progress: bool = True, stop_after: int | None = None,
          log_fn: Callable[[dict], None] | None = None,
          derived_metrics: Mapping = DERIVED_METRICS,
          log: Callable[[str], None] | None = print) -> TrainResult:
    """Run ``rounds`` rounds of ``algorithm`` (resuming from ``workdir`` if it has a checkpoint).

    Args:
      algorithm: from ``fedpriv.fl.algorithms``.
      init_params: initial model parameters (round 0).
      dataset: client id -> dict of example arrays; ``client_ids[i]`` is population member i.
      sampler: host-side sampler over ``range(len(client_ids))``.
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
      workdir: where ``metrics.jsonl`` and checkpoints go (None: nothing written).
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
      stop_after: stop (with a checkpoint) after this many rounds *in this call* — used to
        simulate an interruption.
      derived_metrics: ratios written per round, ``{name: (sum, (count, ...))}``
        (default ``DERIVED_METRICS``: the LM tasks' train loss and accuracy).
      log: where resume messages go (None: silent).
    """
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    rounds = int(rounds)
    if not isinstance(stage, str) or not stage:
        raise ValueError(f"stage must be a non-empty string, got {stage!r}")
    if len(client_ids) != getattr(sampler, "num_clients", len(client_ids)):
        raise ValueError(f"sampler population {sampler.num_clients} != {len(client_ids)} client ids")
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
    ckpt = _checkpointer(workdir, keep_checkpoints) if workdir else None
    k_init, k_rounds = tagged_key(seed, stage, "init"), tagged_key(seed, stage, "rounds")
    state = algorithm.init(init_params, k_init)
    fp = run_fingerprint(algorithm, sampler, dataset, client_ids, seed=seed, stage=stage,
                         populations=populations, batch_size=batch_size, max_steps=max_steps,
                         extra=fingerprint)
    saved = _run_checkpoint(ckpt, state) if ckpt is not None else None
    start, history, evals, charged = 0, [], [], rounds
    if saved is not None:  # ---- resume: every refusal happens before anything changes
        _check_fingerprint(saved.fingerprint, fp, resume_anyway, f"checkpoint in {workdir!r}")
        if saved.round > rounds:
            raise CheckpointError(f"checkpoint in {workdir!r} is at round {saved.round} > rounds={rounds}")
        state, start, charged = saved.state, saved.round, max(saved.charged_rounds, rounds)
        before = None
        if private and saved.ledger is None:
            if saved.accounted or ledger is not None or not nonprivate_ok:
                raise PrivacyAccountingError(
                    f"checkpoint in {workdir!r} of private stage {stage!r} carries no ledger, so "
                    "its cost is unknown; refusing to resume (nonprivate_ok=True continues an "
                    "unaccounted run without a ledger)")
        elif private:
            recorded = saved.ledger
            if recorded.entry(stage) is None:
                raise PrivacyAccountingError(f"checkpoint in {workdir!r}: its ledger has no entry "
                                             f"{stage!r}, so this run's cost is not recorded")
            before = recorded.spent()
            work = recorded  # merge and extend on a copy: a refusal leaves the caller's ledger as is
            if ledger is not None:
                work = PrivacyLedger.from_dict(ledger.to_dict())
                work.absorb(recorded, exclude=stage)
            if rounds > saved.charged_rounds:  # more rounds: charge the new total schedule
                work.replace(stage, event, populations, note=f"{rounds} rounds (extended on resume "
                             f"from {saved.charged_rounds})", details=details(rounds))
            if ledger is None:
                ledger = work
            else:
                ledger.entries = work.entries
        if log is not None:
            cost = ("non-private algorithm" if not private else "unaccounted (nonprivate_ok)"
                    if ledger is None else
                    f"epsilon spent {ledger.spent():.4g} of {ledger.epsilon:g} (delta {ledger.delta:g}), "
                    f"charged up front for {charged} rounds"
                    + (f"; was {before:.4g} for {saved.charged_rounds}" if charged > saved.charged_rounds
                       else ""))
            log(f"{stage}: resumed {workdir} at round {start} of {rounds}: {cost}")
    elif private and ledger is None and not nonprivate_ok:
        raise PrivacyAccountingError(
            f"stage {stage!r}: a private algorithm needs a PrivacyLedger to charge its cost "
            "(or nonprivate_ok=True to run unaccounted)")
    elif private and ledger is not None:
        if ledger.entry(stage) is not None:
            raise PrivacyAccountingError(f"the ledger already has an entry {stage!r}: give each "
                                         "train() call its own stage")
        ledger.spend(stage, event, populations, note=f"{rounds} rounds", details=details(rounds))
    accounted = private and ledger is not None
    if accounted and charged != rounds:  # resumed with fewer rounds than charged: report the charge
        event = privacy_event(dp, sampler, charged)
        executed = privacy_event(dp, sampler, charged, simulated=False) if executed is not None else None
    if accounted and charged < rounds:  # never, by construction: every round run is charged
        raise PrivacyAccountingError(f"stage {stage!r}: {rounds} rounds but {charged} charged")
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        _reconcile_metrics(workdir, start)
    executor = CohortExecutor(algorithm, dataset, batch_size=batch_size, max_steps=max_steps,
                              capacity=int(getattr(sampler, "max_cohort_size")),
                              variable_cohort=isinstance(sampler, PoissonSampler)
                              or bool(getattr(sampler, "variable_cohort", False)),
                              lanes=lanes, mesh=mesh)
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
        row = {"round": r + 1, **_scalarize({**metrics, "real_steps": packed.real_steps,
                                             "executed_steps": packed.executed_steps}, derived_metrics)}
        if NONPRIVATE + "train_loss" in row:
            bar.set_postfix(loss=f"{row[NONPRIVATE + 'train_loss']:.3f}", refresh=False)
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
            _commit(ckpt, state, ledger, charged_rounds=charged, accounted=accounted, fingerprint=fp)
    bar.close()
    if ckpt is not None:
        ckpt.close()
    return TrainResult(state, ledger, history, evals, start, event if accounted else None,
                       executed if accounted else None, charged)
