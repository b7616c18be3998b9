"""Algorithm 1 of Wang et al. 2023 (§3.2, §4, §5) with its variants, as a list of stages.

One function yields every row of Table 2 (`algorithm1`), run through `fedpriv.fl.stages.run_stages`
with one ledger threaded through and each stage resumable:

    ① DP-FTRL for T' rounds (the engine's `train(..., stop_after=T')`; the engine spends the
      whole T-round DP-FTRL event in the ledger before round 0);
    ② log p_priv(x) under the round-T' DP checkpoint (`metrics.sequence_logprob`) and
      log p_pub(x) under the teacher (`fedpriv.public.pool`), for every public x (with a restricted
      vocabulary an UNK target is a class of teacher tokens: by default p(UNK) is spread uniformly
      over it, see `private_logprob`, so sequences full of dropped words are not preferred);
    ③ scores (1−β)·log p_pub + β·log p_priv (β=0.5: the paper's ĥ; β=1: "w/o p_pub", Table 3);
      keep the top q fraction (`select.distribution_matching_select`);
    ④ public mid-training of the checkpoint on the selected subset with
      L_pub = L_LM + β_KD·CE(z_S/t, z_T/t) (`pretrain.train_central` + `distill.make_distill_loss`),
      swapped into the DP-FTRL checkpoint with `loop.replace_params` — post-processing of a DP
      output, recorded in the ledger at zero cost;
    ⑤ DP-FTRL resumes for rounds T'..T: same round counter, tree-noise state, sampler position
      and ledger (no new privacy event).

Stages (T' > 0): ``<stage>-1`` (①, in its own directory, optionally forked from a directory shared
by several variants), ``public mid-training`` (②–④ on a fork of ①'s run), ``<stage>-2`` (⑤ on a
fork of the swapped run; at T' = T it runs no round: the final model is the publicly trained
DP checkpoint, Table 4's last column); T' = 0: ``public pre-training`` then ``<stage>`` (rounds 0..T from the
publicly trained params). Variants through `PublicTrainingSpec`: ``selection="random"``
(mid-training without distribution matching), ``kd_beta=0`` (public LM loss only), ``t_prime=0``
(public *pre*-training before any private round, §3.2/§4: on a random q fraction or
``selection="all"``; distribution matching is impossible there, §5.3).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.loop import TrainResult, checkpoint_round, fork_run, load_run, replace_params, train
from fedpriv.fl.stages import Stage, run_stages, stage_dir
from fedpriv.models import metrics
from fedpriv.public import distill, pretrain, select
from fedpriv.public.pool import PublicPool
from fedpriv.public.vocab import unk_class_size
from fedpriv.report import save_json

SELECTIONS = ("matching", "random", "all")
SELECTION_FILE = "public_selection.npz"
RECORD_FILE = "public_training.json"


def private_logprob(task, params, pool: PublicPool, batch_size: int = 256, *,
                    unk_correction: bool = True) -> np.ndarray:
    """log p_priv(x): average token log-prob of every pool sequence under the on-device LM
    (Algorithm 1 line 6; `metrics.sequence_logprob`): float32[N].

    With the vocabulary restriction, an UNK target is a *class* of teacher tokens, not a
    token, so the raw average rewards sequences full of out-of-vocabulary words (a model that
    learned to predict UNK scores them high). ``unk_correction`` (default) spreads p(UNK)
    uniformly over the U teacher ids mapped to UNK, making p_priv a distribution over teacher
    token sequences like the paper's full-vocabulary student:

        log p_priv(x) = (1/|T|) Σ_t log p(y_t)  −  (#UNK targets / |T|) · log U.

    (Without restriction, U = #control ids and the correction is negligible.)
    """
    lp = metrics.sequence_logprob(task, params, pool.tokens, batch_size)
    if not unk_correction:
        return lp
    targets = pool.tokens[:, 1:]
    n = np.maximum((targets != metrics.PAD).sum(1), 1)
    n_unk = (targets == metrics.UNK).sum(1)
    u = max(unk_class_size(pool.restriction), 1)
    return (lp - n_unk / n * np.log(u)).astype(np.float32)


def select_public(num: int, q: float, *, selection: str, seed: int = 0,
                  logp_priv: np.ndarray | None = None, logp_pub: np.ndarray | None = None,
                  beta: float = 0.5) -> np.ndarray:
    """Indices of the public subset D' (|D'| = ⌈q·N⌉; ``all``: every index), int64.

    ``matching``: top-q by (1−β)·logp_pub + β·logp_priv (Algorithm 1 lines 10–11);
    ``random``: a uniform q fraction drawn with ``np.random.default_rng(seed)`` (§4, "randomly
    sampled"); ``all``: the whole pool (§3.2).
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection == "all":
        return np.arange(num, dtype=np.int64)
    m = select.num_selected(num, q)
    if selection == "random":
        return np.sort(np.random.default_rng(seed).choice(num, m, replace=False)).astype(np.int64)
    if logp_priv is None or logp_pub is None:
        raise ValueError("distribution matching needs logp_priv and logp_pub")
    return select.distribution_matching_select(logp_priv, logp_pub, q, beta)


def public_training(task, params, pool: PublicPool, indices: Sequence[int], *, kd_beta: float,
                    temperature: float = 1.0, steps: int, batch_size: int, seed: int,
                    learning_rate: float = 1e-3, clip: float | None = 1.0,
                    workdir: str | None = None, progress: bool = True,
                    desc: str = "public training", log: Callable[[str], None] | None = print):
    """Central training of the student on pool rows `indices` (§3.2 / §4; App. B.2–B.3).

    ``kd_beta > 0``: L_pub = L_LM + β·CE(z_S/t, z_T/t) against the teacher's top-k
    (`distill.make_distill_loss`); ``kd_beta == 0``: the plain LM loss (`task.loss_fn`).
    Adam with gradient clipping (`pretrain.adam_with_clipping`), resumable from `workdir`.

    Returns:
      ``(params, history)`` of `pretrain.train_central`.
    """
    loss_fn, optimizer = _objective(task, kd_beta, temperature, learning_rate, clip)
    return pretrain.train_central(loss_fn, params, pool.arrays(indices, kd_beta > 0), steps=steps,
                                  batch_size=batch_size, seed=seed, optimizer=optimizer,
                                  workdir=workdir, progress=progress, desc=desc, log=log)


@functools.lru_cache(maxsize=8)
def _objective(task, kd_beta: float, temperature: float, learning_rate: float,
               clip: float | None):
    """(loss_fn, optimizer) of `public_training`, one pair per setting: the rows of an
    experiment that train with the same L_pub share one compiled step (`pretrain._step_fn`)."""
    loss_fn = (distill.make_distill_loss(task.apply, beta=kd_beta, temperature=temperature)
               if kd_beta > 0 else task.loss_fn)
    return loss_fn, pretrain.adam_with_clipping(learning_rate, clip)


@dataclasses.dataclass(frozen=True)
class PrivateTraining:
    """One DP-FTRL run of ``rounds`` = T rounds, as arguments of the engine's `train`.

    The engine derives and spends the event of all T rounds before round 0, whatever T'.
    ``stage`` names the run (ledger entry, key tag); ``fingerprint``: extra config fields a
    resumed run must match.
    """

    algorithm: Any
    sampler: Any
    dataset: Mapping
    client_ids: Sequence[str]
    rounds: int
    batch_size: int
    seed: int
    max_steps: int | None = None
    eval_fn: Callable | None = None
    eval_every: int = 0
    checkpoint_every: int = 0
    stage: str = "dp-ftrl"
    fingerprint: Mapping | None = None
    progress: bool = True
    log_fn: Callable[[dict], None] | None = None
    lanes: str | int = "auto"
    batching: str = "padded"   # local batches (`fedpriv.fl.loop.train`)

    def run(self, init_params, workdir: str, ledger: PrivacyLedger | None = None,
            stop_after: int | None = None) -> TrainResult:
        """`train` this run from `init_params` (or resume `workdir`), optionally stopping."""
        return train(self.algorithm, init_params, self.dataset, list(self.client_ids),
                     self.sampler, rounds=self.rounds, batch_size=self.batch_size,
                     seed=self.seed, workdir=workdir, max_steps=self.max_steps,
                     eval_fn=self.eval_fn, eval_every=self.eval_every,
                     checkpoint_every=self.checkpoint_every, ledger=ledger, stage=self.stage,
                     fingerprint=self.fingerprint, progress=self.progress, stop_after=stop_after,
                     log_fn=self.log_fn, lanes=self.lanes, batching=self.batching)

    def template(self, init_params):
        """A server state with the structure of this run's checkpoints."""
        return self.algorithm.init(init_params, jax.random.key(self.seed))


def _ledger_names(workdir: str) -> list[str]:
    run = load_run(workdir)
    return [e.name for e in run.ledger.entries] if run is not None and run.ledger else []


def run_until(private: PrivateTraining, init_params, workdir: str, round_: int,
              ledger: PrivacyLedger | None = None) -> int:
    """Run (or resume) `private` in `workdir` until its checkpoint is at round `round_`.

    Returns the round reached; raises if the checkpoint is already past `round_`.
    """
    r = checkpoint_round(workdir) or 0
    if r > round_:
        raise ValueError(f"{workdir} is at round {r} > {round_}")
    if r < round_:
        private.run(init_params, workdir, ledger, stop_after=round_ - r)
    return checkpoint_round(workdir) or 0


@dataclasses.dataclass(frozen=True)
class PublicTrainingSpec:
    """How Algorithm 1 uses the public pool.

    Attributes:
      t_prime: T' (0 = public pre-training before any private round; paper: T/2).
      q: fraction of the pool used for public training (paper: 0.08% mid-training, 1% pre-training).
      selection: "matching" (top-q by score_β, needs T' > 0), "random" or "all".
      beta: distribution-matching weight on log p_priv (0.5 = ĥ; 1 = "w/o p_pub").
      kd_beta: β of L_pub = L_LM + β·L_KD (App. B.3 grid {1e-1, 1e-2, 1e-3}; 0 = LM loss only).
      temperature: t (App. B.3: 1).
      steps, batch_size, learning_rate, clip: central training (App. B.2: Adam, lr 1e-3).
      seed: random selection and minibatch order.
      score_batch_size: batch for log p_priv.
      unk_correction: spread p(UNK) over the teacher ids folded into UNK (`private_logprob`).
    """

    t_prime: int
    q: float = 0.01
    selection: str = "matching"
    beta: float = 0.5
    kd_beta: float = 0.1
    temperature: float = 1.0
    steps: int = 100
    batch_size: int = 32
    learning_rate: float = 1e-3
    clip: float | None = 1.0
    seed: int = 0
    score_batch_size: int = 256
    unk_correction: bool = True

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.t_prime < 0:
            raise ValueError(f"t_prime must be >= 0, got {self.t_prime}")
        if self.selection == "matching" and self.t_prime == 0:
            raise ValueError("distribution matching needs a private model: T' > 0 (at T' = 0 only "
                             "random or all public data can be used, Wang et al. §5.3)")
        if self.kd_beta < 0 or self.steps < 0:
            raise ValueError("kd_beta and steps must be >= 0")

    @property
    def phase(self) -> str:
        return "mid-training" if self.t_prime > 0 else "pre-training"


@dataclasses.dataclass
class Algorithm1Result:
    """The outcome of `algorithm1`.

    Attributes:
      result: the engine's `TrainResult` of the final stage (state at round T, ledger).
      selected: int64[|D'|] pool indices used for public training.
      logp_priv: float32[N] log p_priv under the round-T' checkpoint (None unless matching).
      scores: float64[N] matching scores (None unless matching).
      shares: `select.source_shares` of the selection.
      public: dict of the public-training record (history ends, round, timings).
      workdir: the directory of the final DP-FTRL run (checkpoints, metrics of rounds 1..T).
    """

    result: TrainResult
    selected: np.ndarray
    logp_priv: np.ndarray | None
    scores: np.ndarray | None
    shares: dict
    public: dict
    workdir: str


def _save_selection(workdir, idx, logp_priv, scores):
    tmp = os.path.join(workdir, SELECTION_FILE + ".tmp.npz")
    np.savez(tmp, selected=idx,
             logp_priv=np.zeros(0, np.float32) if logp_priv is None else logp_priv,
             scores=np.zeros(0, np.float64) if scores is None else scores)
    os.replace(tmp, os.path.join(workdir, SELECTION_FILE))


def _load_selection(workdir):
    with np.load(os.path.join(workdir, SELECTION_FILE)) as z:
        lp, sc = z["logp_priv"], z["scores"]
        return z["selected"], (lp if lp.size else None), (sc if sc.size else None)


def _note(spec: PublicTrainingSpec) -> str:
    return (f"public {spec.phase} at round {spec.t_prime} on {spec.selection} q={spec.q:g}"
            + (f" (beta={spec.beta:g})" if spec.selection == "matching" else "")
            + (f" with distillation (beta_kd={spec.kd_beta:g}, t={spec.temperature:g})"
               if spec.kd_beta > 0 else " with LM loss"))


def _train_public(task, params, pool, idx, spec, workdir, progress, log):
    return public_training(task, params, pool, idx, kd_beta=spec.kd_beta,
                           temperature=spec.temperature, steps=spec.steps,
                           batch_size=spec.batch_size, seed=spec.seed,
                           learning_rate=spec.learning_rate, clip=spec.clip,
                           workdir=os.path.join(workdir, "public_training"), progress=progress,
                           desc=f"public {spec.phase}", log=log)


def _public_step(private, task, pool, spec, params, workdir, progress, log):
    """Steps ②–④ on `params`: selection (saved in `workdir`), central training, the record."""
    logp_priv = scores = None
    if spec.selection == "matching":
        logp_priv = private_logprob(task, params, pool, spec.score_batch_size,
                                    unk_correction=spec.unk_correction)
        scores = select.matching_scores(logp_priv, pool.logp_pub, spec.beta)
    idx = select_public(len(pool), spec.q, selection=spec.selection, seed=spec.seed,
                        logp_priv=logp_priv, logp_pub=pool.logp_pub, beta=spec.beta)
    _save_selection(workdir, idx, logp_priv, scores)
    t0 = time.perf_counter()
    new, hist = _train_public(task, params, pool, idx, spec, workdir, progress, log)
    record = {"note": _note(spec), "round": spec.t_prime, "num_selected": int(len(idx)),
              "steps": spec.steps, "seconds": time.perf_counter() - t0,
              "first_loss": hist[0]["loss"] if hist else None,
              "last_loss": hist[-1]["loss"] if hist else None,
              "spec": dataclasses.asdict(spec)}
    if private.eval_fn is not None:  # the model handed to (the rest of) DP-FTRL
        record["eval_after_public_training"] = {
            k: float(v) for k, v in private.eval_fn(new).items()}
    save_json(record, os.path.join(workdir, RECORD_FILE))
    return new, record


def algorithm1_stages(private: PrivateTraining, task, init_params, pool: PublicPool,
                      spec: PublicTrainingSpec, *, stage1_workdir: str | None = None,
                      progress: bool = True, log: Callable[[str], None] = print,
                      results: dict | None = None) -> list[Stage]:
    """The stages of Algorithm 1 for `run_stages` (see the module docstring).

    ``stage1_workdir``: optional directory shared by variants for rounds 0..T' (same private run
    and init_params): computed once and forked (`loop.fork_run`). The final stage puts its
    `TrainResult` in ``results['train']`` when ``results`` is given.
    """
    T, tp = private.rounds, spec.t_prime
    if not 0 <= tp <= T:  # T' = T: public training after the last private round (Table 4)
        raise ValueError(f"need 0 <= T' <= T, got T'={tp}, T={T}")
    public_name, note = f"public {spec.phase}", _note(spec)
    out = results if results is not None else {}

    if tp == 0:
        def pre(ctx):
            _, record = _public_step(private, task, pool, spec, init_params, ctx.workdir,
                                     progress, log)
            ctx.ledger.record_post_processing(
                public_name, note="public data only, before any private round: no privacy cost")
            return record

        def dp(ctx):
            params = init_params  # with a checkpoint, init only gives the state's structure
            if checkpoint_round(ctx.workdir) is None:  # the publicly trained params (resumed)
                params, _ = _train_public(task, init_params, pool,
                                          _load_selection(ctx.dir(public_name))[0], spec,
                                          ctx.dir(public_name), False, None)
            log(f"{note}; DP-FTRL rounds 0..{T}")
            out["train"] = private.run(params, ctx.workdir, ctx.ledger)
            return {"round": int(out["train"].state.round)}

        return [Stage(public_name, pre), Stage(private.stage, dp)]

    first, last = f"{private.stage}-1", f"{private.stage}-2"

    def stage1(ctx):
        if checkpoint_round(ctx.workdir) is None and stage1_workdir is not None:
            run_until(private, init_params, stage1_workdir, tp, ctx.ledger)
            fork_run(stage1_workdir, ctx.workdir)
        reached = run_until(private, init_params, ctx.workdir, tp, ctx.ledger)
        ctx.ledger.absorb(load_run(ctx.workdir).ledger)  # a forked run's cost, once
        log(f"stage 1: DP-FTRL rounds 0..{reached} done; {note}")
        return {"round": reached}

    def public(ctx):
        if checkpoint_round(ctx.workdir) is None:
            fork_run(ctx.dir(first), ctx.workdir)
        if public_name not in _ledger_names(ctx.workdir):  # else: swapped before an interruption
            replace_params(ctx.workdir, private.template(init_params),
                           lambda p: _public_step(private, task, pool, spec, p, ctx.workdir,
                                                  progress, log)[0],
                           ledger_note=public_name)
        ctx.ledger.absorb(load_run(ctx.workdir).ledger)
        with open(os.path.join(ctx.workdir, RECORD_FILE)) as f:
            return json.load(f)

    def stage2(ctx):  # at T' = T: no round left, the final model is the publicly trained one
        if checkpoint_round(ctx.workdir) is None:
            fork_run(ctx.dir(public_name), ctx.workdir)
        log(f"stage 2: DP-FTRL rounds {tp}..{T}")
        out["train"] = private.run(init_params, ctx.workdir, ctx.ledger)
        return {"round": int(out["train"].state.round)}

    return [Stage(first, stage1), Stage(public_name, public), Stage(last, stage2)]


def algorithm1(private: PrivateTraining, task, init_params, pool: PublicPool,
               spec: PublicTrainingSpec, *, workdir: str, ledger: PrivacyLedger,
               stage1_workdir: str | None = None, progress: bool = True,
               log: Callable[[str], None] = print) -> Algorithm1Result:
    """Wang et al. 2023, Algorithm 1 (and its T'=0 / random-selection / LM-loss variants).

    Args:
      private: the T-round DP-FTRL run (its privacy event covers all T rounds).
      task: the on-device LM (`LMTask`: apply, loss_fn) whose params the engine trains.
      init_params: the randomly initialised LM (Algorithm 1 line 1).
      pool: the public pool (with top-k arrays if ``spec.kd_beta > 0``).
      spec: T', q, selection, β, L_pub settings.
      workdir: the pipeline's directory (`run_stages`: ``stages.json``, one directory per stage).
      ledger: the pipeline's one ledger (the DP-FTRL event is spent into it before round 0;
        public training is recorded as post-processing). On resume it must have the recorded
        budget; its entries become the recorded ones.
      stage1_workdir: optional shared directory for rounds 0..T' (see `algorithm1_stages`).

    Returns:
      `Algorithm1Result`; ``result.state.round == T``.
    """
    out: dict = {}
    stages = algorithm1_stages(private, task, init_params, pool, spec,
                               stage1_workdir=stage1_workdir, progress=progress, log=log,
                               results=out)
    fingerprint = {"spec": dataclasses.asdict(spec), "rounds": private.rounds,
                   "seed": private.seed, "stage": private.stage, **dict(private.fingerprint or {})}
    run = run_stages(stages, workdir, ledger, fingerprint=fingerprint, log=log)
    run_dir = stage_dir(workdir, len(stages) - 1, stages[-1].name)
    result = out.get("train")
    if result is None:  # finished in an earlier session: a no-op resume at round T
        result = private.run(init_params, run_dir, run.ledger)
    public_dir = stage_dir(workdir, 0 if spec.t_prime == 0 else 1, f"public {spec.phase}")
    idx, logp_priv, scores = _load_selection(public_dir)
    return Algorithm1Result(result, idx, logp_priv, scores,
                            select.source_shares(pool.sources, idx),
                            run.results[f"public {spec.phase}"], run_dir)


def private_only(private: PrivateTraining, init_params, workdir: str, ledger: PrivacyLedger, *,
                 stage1_workdir: str | None = None, t_prime: int = 0) -> TrainResult:
    """The run without public training (Table 2's first row), in `workdir`: its first `t_prime`
    rounds forked from `stage1_workdir` (shared with `algorithm1`'s mid-training variants)."""
    if checkpoint_round(workdir) is None and stage1_workdir is not None and t_prime > 0:
        run_until(private, init_params, stage1_workdir, t_prime, ledger)
        fork_run(stage1_workdir, workdir)
    return private.run(init_params, workdir, ledger)
