"""Resuming a run from its checkpoint (``fedpriv.fl.loop.train``), failing closed.

Resuming (``resume``):

- refuses a checkpoint whose fingerprint differs (naming the fields); ``resume_anyway`` may
  name only fields that do not change privacy (``run_records.TRAINING_FIELDS`` and the caller's
  own ``fingerprint`` fields);
- carries the recorded cost: the checkpoint's ledger is merged into the caller's
  (``PrivacyLedger.absorb``) or used as is; more rounds than were charged replace the run's
  entry by the event of the new total schedule (checked against the budget before any round
  runs); a private run whose checkpoint has no ledger is refused (unless ``nonprivate_ok``);
- falls back to the newest intact commit when the latest is damaged (one line says so; the
  damaged commit is moved to ``checkpoints.damaged/``, ``tidy_workdir``), after checking that
  the older commit's ledger covers everything the workdir shows was run and charged
  (``fallback_floor``: the damaged commit's recorded charge, metrics rows, ``epsilon_spent``
  values); otherwise refused.

``tidy_workdir`` then truncates ``metrics.jsonl`` to the checkpoint's round (dropping a torn last
line), so the log holds exactly one row per round after any sequence of crashes; rows missing
before the checkpoint cannot be recomputed without replaying the run: one line says which
rounds the curve lacks.
"""
from __future__ import annotations

import math
import os
import warnings

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.checkpoint import Checkpointer, CheckpointError
from fedpriv.fl.metrics_log import METRICS, read_rows, reconcile
from fedpriv.fl.run_records import PrivacyAccountingError, RunCheckpoint, check_resume_fingerprint

__all__ = ["resume", "tidy_workdir", "fallback_floor", "say"]


def resume(saved, ckpt, workdir, fp, resume_anyway, *, rounds, private, ledger, nonprivate_ok,
            stage, event, populations, details, dry_run, log):
    """Continue from checkpoint ``saved``: every refusal happens before anything changes.
    Returns ``(state, start, charged, ledger)`` -- the ledger merged with (and extended by) the
    checkpoint's own when the run is longer than what it charged."""
    check_resume_fingerprint(saved.fingerprint, fp, resume_anyway, f"checkpoint in {workdir!r}")
    if saved.round > rounds:
        raise CheckpointError(f"checkpoint in {workdir!r} is at round {saved.round} > rounds={rounds}")
    state, start, charged = saved.state, saved.round, max(saved.charged_rounds, rounds)
    floor = fallback_floor(ckpt, saved, workdir) if saved.skipped and private else None
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
        say(log, f"{stage}: {'; '.join(r for _, r in saved.skipped)} -- damaged; fell back "
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


def tidy_workdir(workdir, ckpt, saved, start, stage, log) -> list:
    """Before round ``start``: quarantine damaged commits (keep-N must never drop the intact
    one) and reconcile the metrics file with the checkpoint; returns the rounds missing from it."""
    if saved is not None and saved.skipped:
        ckpt.quarantine([step for step, _ in saved.skipped])
    gaps = reconcile(workdir, start)
    if gaps:
        say(log, f"{stage}: {os.path.join(workdir, METRICS)} has no rows for rounds "
                  + ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in gaps)
                  + f" (deleted or cut before the checkpoint at round {start}): the curve has "
                  "gaps there; they are not recomputed")
    return gaps


def say(log, message: str) -> None:
    """A one-line notice: to ``log``, or as a warning when the caller silenced ``log``."""
    if log is not None:
        log(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def fallback_floor(ckpt: Checkpointer, saved: RunCheckpoint, workdir: str):
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
    for row in read_rows(os.path.join(workdir, METRICS)):
        if not isinstance(row, dict):
            continue
        r, e = row.get("round"), row.get("epsilon_spent")
        if isinstance(r, int) and r > rounds:
            rounds, r_src = r, METRICS
        if isinstance(e, (int, float)) and math.isfinite(e) and e > eps:
            eps, e_src = float(e), METRICS
    return rounds, eps, r_src, e_src
