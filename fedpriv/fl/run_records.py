"""A run's records on disk: its fingerprint and its checkpoints (``fedpriv.fl.loop`` writes them).

**Fingerprint** (``run_fingerprint``): the identity of a run, rounds aside -- what a resumed run
must match. Privacy fields (stage, seed, the mechanism, the expected cohort, the sampler, the
population and the ledger populations) can never be overridden; ``TRAINING_FIELDS`` and the
caller's own ``extra`` fields may be named in ``resume_anyway``.

**Checkpoints** (``fedpriv.fl.checkpoint``: one atomic orbax commit, keep-N) hold the server
state (params, optimizer, noise and clip state with their PRNG keys), the round, the ledger, the
rounds charged and the run's fingerprint (``commit`` / ``read_checkpoint``). ``load_run`` reads
the latest intact one; ``replace_params`` continues a run with new params (Wang et al.'s public
mid-training: post-processing, recorded in the ledger at zero cost); ``fork_run`` starts a
branch as a copy. Each holds the workdir's lock (``fedpriv.fl.workdir``) while it writes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from typing import Callable, Mapping, Sequence

import jax

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl import inputs, workdir as wdlock
from fedpriv.fl.algorithms import FederatedAlgorithm, ServerState
from fedpriv.fl.checkpoint import (
    CHECKPOINTS,
    EXTRA_PREFIX,
    Checkpointer,
    CheckpointError,
    check_fingerprint,
    json_safe,
)
from fedpriv.fl.metrics_log import METRICS

LEGACY_FILES = ("checkpoint.msgpack", "checkpoint.json")  # the old two-file format

# Fingerprint fields that may differ on resume when named in ``resume_anyway``: they change
# the training, not the privacy (clipping bounds each user's contribution whatever they are).
# Every other loop field (stage, seed, dp, expected cohort, sampler, population, populations,
# accounting) changes the mechanism or where it is charged and can never be overridden.
TRAINING_FIELDS = ("batch_size", "max_steps", "client_sizes")

__all__ = ["RunCheckpoint", "load_run", "checkpoint_round", "replace_params", "fork_run",
           "run_fingerprint", "check_resume_fingerprint", "describe", "TRAINING_FIELDS",
           "PrivacyAccountingError", "lock_name", "checkpointer", "commit", "read_checkpoint"]


class PrivacyAccountingError(CheckpointError):
    """A private run would go unaccounted (no ledger), or its recorded cost is missing."""


# ----------------------------------------------------------------------------- fingerprint
def describe(obj) -> dict:
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
    fp = {"stage": stage, "seed": int(seed), "dp": describe(algorithm.dp),
          "expected_cohort_size": float(algorithm.expected_cohort_size),
          "sampler": describe(sampler), "population": _sha([str(c) for c in client_ids]),
          "populations": list(populations),
          "batch_size": int(batch_size), "max_steps": max_steps,
          "client_sizes": _sha([_num_examples(dataset, c) for c in client_ids])}
    for k, v in (extra or {}).items():
        fp[EXTRA_PREFIX + str(k)] = json_safe(v)
    return json_safe(fp)


def check_resume_fingerprint(saved: dict, current: dict, resume_anyway: Sequence[str], where: str):
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


def lock_name() -> str:
    """``.lock``; ``.lock.p<i>`` on process i > 0 of a ``jax.distributed`` run (one run)."""
    return wdlock.LOCK_FILE if jax.process_count() == 1 else f"{wdlock.LOCK_FILE}.p{jax.process_index()}"


def checkpointer(workdir: str, keep: int = 2) -> Checkpointer:
    if not os.path.isdir(os.path.join(workdir, CHECKPOINTS)) and any(
            os.path.exists(os.path.join(workdir, f)) for f in LEGACY_FILES):
        raise CheckpointError(f"{workdir} holds a checkpoint in the old two-file format (not atomic, "
                              "no config fingerprint); it cannot be resumed safely: use another workdir")
    return Checkpointer(os.path.join(workdir, CHECKPOINTS), keep)


def commit(ckpt: Checkpointer, state: ServerState, ledger: PrivacyLedger | None, *,
            charged_rounds: int, accounted: bool, fingerprint: dict) -> None:
    server = state["server"] if isinstance(state, dict) else state  # (with client states)
    ckpt.save(state, {"round": int(server.round), "ledger": ledger.to_dict() if ledger else None,
                      "charged_rounds": int(charged_rounds), "accounted": bool(accounted),
                      "fingerprint": fingerprint, "time": time.time()})


def read_checkpoint(ckpt: Checkpointer, template=None) -> RunCheckpoint | None:
    if template is None:
        meta, state = ckpt.meta(), None
        if meta is None:
            return None
    else:
        loaded = ckpt.restore(template)
        if loaded is None:
            return None
        state, meta = loaded
        server = state["server"] if isinstance(state, dict) else state  # (with client states)
        if int(server.round) != int(meta["round"]):
            raise CheckpointError(f"checkpoint in {ckpt.directory}: state at round {int(server.round)} "
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
    ckpt = checkpointer(workdir)
    try:
        return read_checkpoint(ckpt, template)
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
    with wdlock.locked(workdir, lock_name()):
        ckpt = checkpointer(workdir)
        run = read_checkpoint(ckpt, template)
        if run is None:
            raise CheckpointError(f"no checkpoint in {workdir!r} to continue from")
        if run.skipped:  # fail closed: recovery (and its ledger checks) is train()'s job
            raise CheckpointError(f"the latest checkpoint in {workdir!r} is damaged "
                                  f"({run.skipped[0][1]}); resume the run with train() first")
        return _replace_params(ckpt, run, fn, ledger_note)


def _replace_params(ckpt, run, fn, ledger_note):
    server = run.state["server"] if isinstance(run.state, dict) else run.state
    new_params = fn(server.params)
    if jax.tree_util.tree_structure(new_params) != jax.tree_util.tree_structure(server.params):
        raise ValueError("fn changed the parameter structure; the run cannot continue")
    if run.ledger is not None and ledger_note:
        run.ledger.record_post_processing(ledger_note)
    server = server.replace(params=new_params)
    state = dict(run.state, server=server) if isinstance(run.state, dict) else server
    commit(ckpt, state, run.ledger, charged_rounds=run.charged_rounds,
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
    with wdlock.locked(dst, lock_name()):
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
