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
  holds exactly one row per round after any sequence of crashes; rows missing before the
  checkpoint (a deleted or cut log) cannot be recomputed without replaying the run: the loop
  says in one line which rounds the curve lacks (``TrainResult.metrics_gaps``);
- falls back to the newest intact commit when the latest is damaged (one line says so; the
  damaged commit is moved to ``checkpoints.damaged/``), after checking that the older commit's
  ledger covers everything the workdir shows was run and charged (the damaged commit's recorded
  charge, metrics rows, ``epsilon_spent`` values); otherwise, or with no intact commit, refused.

One writer per workdir: ``train`` (and ``replace_params``, ``fork_run``) hold the workdir's
exclusive lock (``fedpriv.fl.workdir``) while they write; a second process is refused in one
line naming the holder. A workdir that is a file or read-only, and a write that fails (disk
full), are one-line ``WorkdirError``/``CheckpointWriteError``; nothing already written is lost.

Before anything is charged, one round is traced abstractly (``jax.eval_shape``: client steps
with the caller's ``loss_fn``, clipping, noise, server update; no compilation, no data): a bug in
user code raises before the ledger is charged, so a retry with the same ledger is not refused.
The algorithm's ``expected_cohort_size`` (fixed denominator, and noise scale with
``noise_cohort_size``) must equal the sampler's, which the accounting uses: a mismatch is refused.

Sampling and round keys are pure functions of (seed, stage, round), so a resumed run reproduces
an uninterrupted one bit for bit. Keys carry their purpose: the root key is
``tagged_key(seed, stage, ...)``, so two runs with one seed and different stages draw
independent noise.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
import warnings
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
from fedpriv.fl.checkpoint import (
    CHECKPOINTS,
    EXTRA_PREFIX,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
    ResumeMismatch,
    check_fingerprint,
    json_safe,
)
from fedpriv.fl.execution import CohortExecutor, replicate
from fedpriv.fl.samplers import check_sampler
from fedpriv.fl.workdir import WorkdirError, WorkdirLocked

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
           "read_metrics", "run_fingerprint", "METRICS", "DERIVED_METRICS", "NONPRIVATE", "DP_COVERED_METRICS",
           "PUBLIC_METRICS", "OUTPUTS",
           "nonprivate_key", "TRAINING_FIELDS", "CheckpointError", "CheckpointWriteError",
           "ResumeMismatch", "PrivacyAccountingError", "WorkdirError", "WorkdirLocked"]


# ----------------------------------------------------------------------------- fingerprint
def _describe(obj) -> dict:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a mechanism: its config type
        name = getattr(obj, "config_type", type(obj).__name__)
        return json_safe({"type": name, **dataclasses.asdict(obj)})
    return {"type": type(obj).__name__, "repr": repr(obj)}


def _sha(x) -> str:
    return hashlib.sha256(json.dumps(json_safe(x), sort_keys=True).encode()).hexdigest()[:16]


def _num_examples(dataset, cid) -> int:
    if hasattr(dataset, "num_examples"):
        return int(dataset.num_examples(cid))
    return int(len(next(iter(dataset[cid].values()))))


def run_fingerprint(algorithm: FederatedAlgorithm, sampler, dataset: Mapping, client_ids: Sequence,
                    *, seed: int, stage: str, populations, batch_size: int, max_steps,
                    extra: Mapping | None = None) -> dict:
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
    skipped: list = dataclasses.field(default_factory=list)  # damaged newer commits passed over
    commit: int | None = None  # the commit read


def _lock_name() -> str:
    """``.lock``; ``.lock.p<i>`` on process i > 0 of a ``jax.distributed`` run (one run)."""
    return wdlock.LOCK_FILE if jax.process_count() == 1 else f"{wdlock.LOCK_FILE}.p{jax.process_index()}"


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
                             bool(meta["accounted"]), dict(meta["fingerprint"]), meta,
                             list(ckpt.skipped), ckpt.restored_step)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint in {ckpt.directory} has malformed metadata: {err!r}") from err


def load_run(workdir: str, template: ServerState | None = None) -> RunCheckpoint | None:
    """The latest intact checkpoint of the run in ``workdir`` (None if there is none); damaged
    newer commits passed over are listed in ``RunCheckpoint.skipped``.

    With ``template`` (e.g. ``algorithm.init(params, key)``) the state is restored and verified;
    without it only the metadata (round, ledger, fingerprint) is read.
    """
    if template is not None and not isinstance(template, ServerState):
        raise inputs.TrainInputError(f"template must be a ServerState (algorithm.init(params, key)), got "
                                     f"{type(template).__name__}")
    ckpt = _checkpointer(workdir)
    try:
        return _run_checkpoint(ckpt, template)
    finally:
        ckpt.close()  # its background work (orbax's tmp cleanup) ends before a writer starts


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
    with wdlock.locked(workdir, _lock_name()):
        ckpt = _checkpointer(workdir)
        run = _run_checkpoint(ckpt, template)
        if run is None:
            raise CheckpointError(f"no checkpoint in {workdir!r} to continue from")
        if run.skipped:  # fail closed: recovery (and its ledger checks) is train()'s job
            raise CheckpointError(f"the latest checkpoint in {workdir!r} is damaged "
                                  f"({run.skipped[0][1]}); resume the run with train() first")
        return _replace_params(ckpt, run, fn, ledger_note)


def _replace_params(ckpt, run, fn, ledger_note):
    new_params = fn(run.state.params)
    if jax.tree_util.tree_structure(new_params) != jax.tree_util.tree_structure(run.state.params):
        raise ValueError("fn changed the parameter structure; the run cannot continue")
    if run.ledger is not None and ledger_note:
        run.ledger.record_post_processing(ledger_note)
    _commit(ckpt, run.state.replace(params=new_params), run.ledger, charged_rounds=run.charged_rounds,
            accounted=run.accounted, fingerprint=run.fingerprint)
    ckpt.close()
    return new_params


def fork_run(src: str, dst: str) -> None:
    """Start ``dst`` as a copy of the run in ``src`` (checkpoints incl. ledger, metrics).

    A branch continues exactly as the source would (keys and sampling are functions of (seed,
    stage, round)), so a shared first stage is computed once. The checkpoint directory appears
    in ``dst`` in one rename, after the metrics: an interrupted fork leaves no checkpoint.
    """
    if checkpoint_round(src) is None:
        raise CheckpointError(f"no checkpoint in {src!r} to fork")
    with wdlock.locked(dst, _lock_name()):
        _fork_run(src, dst)


def _fork_run(src: str, dst: str) -> None:
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
NONFINITE = "nonfinite"


def _strict_value(v, path: str, out: dict):
    if isinstance(v, float) and not math.isfinite(v):
        out[path] = repr(v)  # 'nan', 'inf', '-inf'
        return None
    if isinstance(v, list):
        return [_strict_value(x, f"{path}[{i}]", out) for i, x in enumerate(v)]
    return v


def dumps_row(row: Mapping) -> str:
    """One metrics row as a line of strict JSON (RFC 8259: no bare ``NaN``/``Infinity``).

    A non-finite float (a scalar, or an element of a list metric) is written as ``null`` and
    recorded under ``"nonfinite"``: ``{"<key>" | "<key>[i]...": "nan" | "inf" | "-inf"}``, so
    nothing is lost and strict readers (TensorBoard, ``jq``, browsers) accept the file;
    ``read_metrics`` puts the values back.
    """
    bad: dict = {}
    out = {k: _strict_value(v, k, bad) for k, v in row.items()}
    if bad:
        out[NONFINITE] = bad
    return json.dumps(out, allow_nan=False)


def _restore_nonfinite(row):
    """Inverse of ``dumps_row`` on a parsed row (rows of older files, with bare ``NaN``, pass
    through unchanged)."""
    if not isinstance(row, dict) or not isinstance(row.get(NONFINITE), dict):
        return row
    row = dict(row)
    for path, text in row.pop(NONFINITE).items():
        key, _, rest = str(path).partition("[")
        idx = [int(i) for i in rest.rstrip("]").split("][")] if rest else []
        if key not in row:
            continue
        value = float(text)
        if not idx:
            row[key] = value
            continue
        target = row[key]
        for i in idx[:-1]:
            target = target[i]
        target[idx[-1]] = value
    return row


def _read_rows(path: str) -> list[dict]:
    """Rows of a metrics log; a torn last line (a crash mid-write) is dropped. Reads both the
    strict format (``dumps_row``) and older files with bare ``NaN``/``Infinity``."""
    if not os.path.exists(path):
        return []
    if os.path.isdir(path):
        raise WorkdirError(f"{path} is a directory, not a metrics log")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(_restore_nonfinite(json.loads(line)))
        except ValueError:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise CheckpointError(f"{path}: line {i + 1} is not JSON (and is not the last line)")
    return rows


def read_metrics(workdir: str) -> list[dict]:
    """The rows of ``workdir``'s ``metrics.jsonl`` (one per round; a torn last line dropped)."""
    return _read_rows(os.path.join(workdir, METRICS))


def _ranges(rounds: Sequence[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7, 9, 10] -> [(1, 3), (7, 7), (9, 10)]."""
    out: list[list[int]] = []
    for r in sorted(rounds):
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return [tuple(x) for x in out]


def _reconcile_metrics(workdir: str, last_round: int) -> list[tuple[int, int]]:
    """Keep exactly one row per round up to the checkpoint's round (rows past it are recomputed
    identically on resume; none survive a fresh start); drop a torn last line. Returns the
    rounds ``<= last_round`` with no row, as ranges ``[(first, last), ...]`` (a deleted or cut
    log: those rows cannot be rebuilt from the checkpoint, which holds the state, not the
    metrics; they would have to be recomputed by replaying the run)."""
    path = os.path.join(workdir, METRICS)
    by_round = {}
    for row in _read_rows(path):
        if isinstance(row, dict) and isinstance(row.get("round"), int) and 1 <= row["round"] <= last_round:
            by_round[row["round"]] = row
    if os.path.exists(path):
        try:
            with open(path + ".tmp", "w") as f:
                f.writelines(dumps_row(by_round[r]) + "\n" for r in sorted(by_round))
            os.replace(path + ".tmp", path)
        except OSError as err:
            _remove_quietly(path + ".tmp")
            raise WorkdirError(f"cannot rewrite {path}: {wdlock.describe_os_error(err)}; the log "
                               "is unchanged") from err
    return _ranges(sorted(set(range(1, last_round + 1)) - set(by_round)))


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _append_row(path: str, row: Mapping) -> None:
    try:
        with open(path, "a") as f:
            f.write(dumps_row(row) + "\n")
    except OSError as err:
        raise WorkdirError(f"cannot write {path}: {wdlock.describe_os_error(err)}; the rows and "
                           "checkpoints written so far are kept (resume when there is room)") from err


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
    # damaged commits passed over on resume ([(commit, reason)]); rounds without a metrics row
    fell_back: list = dataclasses.field(default_factory=list)
    metrics_gaps: list = dataclasses.field(default_factory=list)


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
    with wdlock.locked(workdir, _lock_name()):  # one writer per workdir (re-entrant)
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


def _resume(saved, ckpt, workdir, fp, resume_anyway, *, rounds, private, ledger, nonprivate_ok,
            stage, event, populations, details, dry_run, log):
    """Continue from checkpoint ``saved``: every refusal happens before anything changes.
    Returns ``(state, start, charged, ledger)`` -- the ledger merged with (and extended by) the
    checkpoint's own when the run is longer than what it charged."""
    _check_fingerprint(saved.fingerprint, fp, resume_anyway, f"checkpoint in {workdir!r}")
    if saved.round > rounds:
        raise CheckpointError(f"checkpoint in {workdir!r} is at round {saved.round} > rounds={rounds}")
    state, start, charged = saved.state, saved.round, max(saved.charged_rounds, rounds)
    floor = _fallback_floor(ckpt, saved, workdir) if saved.skipped and private else None
    if floor is not None and floor[0] > charged:
        raise PrivacyAccountingError(
            f"checkpoint in {workdir!r}: the latest commit is damaged and the newest intact "
            f"one (round {saved.round}) charged {saved.charged_rounds} rounds, but "
            f"{floor[2]} shows {floor[0]} rounds were charged or run; falling back would "
            f"under-report the spend: refusing (resume with rounds>={floor[0]}, or use "
            "another workdir)")
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
            dry_run(state)  # a bug in user code surfaces before anything is charged
            work.replace(stage, event, populations, note=f"{rounds} rounds (extended on resume "
                         f"from {saved.charged_rounds})", details=details(rounds))
        if floor is not None and work.spent() < floor[1] * (1 - 1e-9):
            raise PrivacyAccountingError(
                f"checkpoint in {workdir!r}: the latest commit is damaged and the ledger of the "
                f"newest intact one (round {saved.round}) comes to epsilon {work.spent():.6g}, "
                f"less than the {floor[1]:.6g} that {floor[3]} records; falling back would "
                "under-report the spend: refusing (use another workdir)")
        if ledger is None:
            ledger = work
        else:
            ledger.entries = work.entries
    if saved.skipped:
        _say(log, f"{stage}: {'; '.join(r for _, r in saved.skipped)} -- damaged; fell back "
                  f"to the newest intact commit {saved.commit} (round {saved.round})")
    if log is not None:
        cost = ("non-private algorithm" if not private else "unaccounted (nonprivate_ok)"
                if ledger is None else
                f"epsilon spent {ledger.spent():.4g} of {ledger.epsilon:g} (delta {ledger.delta:g}), "
                f"charged up front for {charged} rounds"
                + (f"; was {before:.4g} for {saved.charged_rounds}" if charged > saved.charged_rounds
                   else ""))
        log(f"{stage}: resumed {workdir} at round {start} of {rounds}: {cost}")
    return state, start, charged, ledger


def _run_rounds(executor, state, sampler, client_ids, *, seed, key, start, end, rounds, eval_fn,
                eval_every, ledger, log_fn, derived_metrics, workdir, checkpoint_every, ckpt, charged,
                accounted, fp, progress):
    """Rounds ``start..end-1``: sample, pack, run, evaluate, log, checkpoint. Returns
    ``(state, history, evals)`` of the rounds run here."""
    history, evals = [], []
    log_path = os.path.join(workdir, METRICS) if workdir else None
    bar = tqdm(range(start, end), initial=start, total=rounds, disable=not progress, desc="rounds",
               dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30.0)
    for r in bar:
        ids = [client_ids[i] for i in sampler.sample(r)]
        # an empty (Poisson) cohort still runs: the noisy zero sum is released, as accounted
        packed = executor.pack(ids, rng=np.random.default_rng([seed, r]))
        state, metrics = executor.run(state, packed, jax.random.fold_in(key, r))
        row = {"round": r + 1, **_scalarize({**metrics, "real_steps": packed.real_steps,
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
            _append_row(log_path, row)
        if workdir and ((checkpoint_every and (r + 1) % checkpoint_every == 0) or r + 1 == end):
            _commit(ckpt, state, ledger, charged_rounds=charged, accounted=accounted, fingerprint=fp)
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
    ckpt = _checkpointer(workdir, keep_checkpoints) if workdir else None
    k_init, k_rounds = tagged_key(seed, stage, "init"), tagged_key(seed, stage, "rounds")
    state = algorithm.init(init_params, k_init)
    fp = run_fingerprint(algorithm, sampler, dataset, client_ids, seed=seed, stage=stage,
                         populations=populations, batch_size=batch_size, max_steps=max_steps,
                         extra=fingerprint)
    saved = _run_checkpoint(ckpt, state) if ckpt is not None else None
    start, charged = 0, rounds
    capacity = int(sampler.max_cohort_size)
    dry_run = lambda st: _dry_run(algorithm, st, dataset, client_ids, batch_size, capacity,  # noqa: E731
                                  k_rounds)
    if saved is not None:
        state, start, charged, ledger = _resume(
            saved, ckpt, workdir, fp, resume_anyway, rounds=rounds, private=private, ledger=ledger,
            nonprivate_ok=nonprivate_ok, stage=stage, event=event, populations=populations,
            details=details, dry_run=dry_run, log=log)
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
    gaps = _tidy_workdir(workdir, ckpt, saved, start, stage, log) if workdir else []
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
        ckpt=ckpt, charged=charged, accounted=accounted, fp=fp, progress=progress)
    if ckpt is not None:
        ckpt.close()
    return TrainResult(state, ledger, history, evals, start, event if accounted else None,
                       executed if accounted else None, charged,
                       list(saved.skipped) if saved is not None else [], gaps)


def _tidy_workdir(workdir, ckpt, saved, start, stage, log) -> list:
    """Before round ``start``: quarantine damaged commits (keep-N must never drop the intact
    one) and reconcile the metrics file with the checkpoint; returns the rounds missing from it."""
    if saved is not None and saved.skipped:
        ckpt.quarantine([step for step, _ in saved.skipped])
    gaps = _reconcile_metrics(workdir, start)
    if gaps:
        _say(log, f"{stage}: {os.path.join(workdir, METRICS)} has no rows for rounds "
                  + ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in gaps)
                  + f" (deleted or cut before the checkpoint at round {start}): the curve has "
                  "gaps there; they are not recomputed")
    return gaps


def _say(log, message: str) -> None:
    """A one-line notice: to ``log``, or as a warning when the caller silenced ``log``."""
    if log is not None:
        log(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _fallback_floor(ckpt: Checkpointer, saved: RunCheckpoint, workdir: str):
    """What a run falling back to ``saved`` must still cover: ``(rounds, epsilon, where the
    rounds were seen, where the epsilon was seen)`` — the largest charge recorded by the damaged
    commits it passed over (their metadata, unverified, where readable) and by ``metrics.jsonl``
    (the last round run, the largest ``epsilon_spent`` reported)."""
    rounds, eps, r_src, e_src = 0, 0.0, "nothing", "nothing"
    for step, _ in saved.skipped:
        meta = ckpt.raw_meta(step) or {}
        try:
            n = int(meta.get("charged_rounds") or 0)
            e = PrivacyLedger.from_dict(meta["ledger"]).spent() if meta.get("ledger") else 0.0
        except (KeyError, TypeError, ValueError):
            continue
        if n > rounds:
            rounds, r_src = n, f"damaged commit {step}"
        if e > eps:
            eps, e_src = e, f"damaged commit {step}"
    for row in _read_rows(os.path.join(workdir, METRICS)):
        if not isinstance(row, dict):
            continue
        r, e = row.get("round"), row.get("epsilon_spent")
        if isinstance(r, int) and r > rounds:
            rounds, r_src = r, METRICS
        if isinstance(e, (int, float)) and math.isfinite(e) and e > eps:
            eps, e_src = float(e), METRICS
    return rounds, eps, r_src, e_src


def _dry_run(algorithm, state, dataset, client_ids, batch_size: int, capacity: int, key) -> None:
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
    try:
        jax.eval_shape(algorithm.apply, state, batch, jax.ShapeDtypeStruct((capacity,), np.float32), key)
    except (TypeError, ValueError, KeyError, IndexError) as err:
        if isinstance(err, FedprivError):
            raise
        raise inputs.describe_trace_error(err, state.params, client_ids[0], first) from err
