"""Arms: several runs that share one cohort schedule, trained as one vmapped program (issue 51).

A table's rows at one seed (e.g. Wang et al.'s "no public training", "pre-training",
"pre-training with distillation": the same DP-FTRL run from different initial parameters) see
the same cohorts and the same round keys; alone, each is one ``fedpriv.fl.loop.train``. On an
accelerator the small on-device models leave the chip mostly idle (39 % of the ceiling at
cohort 16 on an H200, benchmarks/results/gpu_h200.md), so :func:`train_arms` runs the arms' rounds
as ONE program: the round function ``algorithm.apply`` vmapped over a leading arm axis of the
server state (parameters, optimizer state, the mechanism's noise state), with the cohort, its
packed lanes and the round key shared (broadcast) -- exactly what each arm alone would get.
Each arm keeps its own state, its own ledger (charged the same event, before round 0, as
``train`` charges it) and its own metrics and evaluations; the result is one ``TrainResult``
per arm, equal to the arm trained alone up to float summation order (tests/fl/test_arms.py).

On CPU, vmapping parameter sets is slower per arm than running them one after the other
(XLA:CPU's batched matmuls: 0.56-0.70x, issue 51), so CPU keeps process parallelism
(``fedpriv.executor``); this is for GPU/TPU hosts. Not yet: checkpoints and resuming (a
``workdir``), stateful clients, a device mesh; arms whose mechanisms differ (another noise
multiplier is a different program) -- each is refused in one line.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.algorithms import FederatedAlgorithm, privacy_event
from fedpriv.fl.execution import CohortExecutor
from fedpriv.fl.loop import TrainResult, _check_args, _entry_details
from fedpriv.fl.outputs import DERIVED_METRICS, scalarize
from fedpriv.fl.run_records import PrivacyAccountingError

__all__ = ["train_arms", "stack", "unstack"]


def stack(trees: Sequence):
    """Pytrees of one structure -> one pytree with a leading arm axis ``[A, ...]``."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree, n: int) -> list:
    """The inverse of :func:`stack`: ``n`` pytrees."""
    return [jax.tree_util.tree_map(lambda x, i=i: x[i], tree) for i in range(n)]


def train_arms(algorithm: FederatedAlgorithm, init_params: Sequence, dataset: Mapping, client_ids: Sequence,
               sampler, *, rounds: int, batch_size: int, seed: int, ledgers: Sequence[PrivacyLedger | None],
               stage: str = "fl-training", populations=("users",), max_steps: int | None = None,
               eval_fn: Callable | None = None, eval_every: int = 0, lanes: str | int = "auto",
               batching: str = "padded", progress: bool = True,
               derived_metrics: Mapping = DERIVED_METRICS) -> list[TrainResult]:
    """Train ``len(init_params)`` arms of ``algorithm`` for ``rounds`` rounds on one cohort
    schedule (``sampler``, ``seed``): one ``TrainResult`` per arm, as ``train`` would return for
    that arm alone (arguments as ``fedpriv.fl.loop.train``). ``ledgers``: one per arm (each is
    charged the run's event under ``stage`` before round 0; None only for a non-private
    algorithm). Shapes: each ``init_params[a]`` a pytree of one structure; the vmapped round
    runs on ``[A, ...]`` server states."""
    n = len(init_params)
    if n < 1:
        raise ValueError("train_arms needs at least one arm (init_params is empty)")
    if len(ledgers) != n:
        raise ValueError(f"{n} arms need {n} ledgers (one each), got {len(ledgers)}")
    if algorithm.stateful_clients:
        raise ValueError("train_arms: clients that keep state are not supported; train the arms one by one")
    structures = {jax.tree_util.tree_structure(p) for p in init_params}
    if len(structures) != 1:
        raise ValueError("train_arms: the arms' parameters must share one pytree structure")
    for p in init_params:  # the loop's input checks (bad inputs refused in one line), per arm
        _check_args(algorithm, sampler, client_ids, rounds, stage, dataset=dataset, init_params=p, seed=seed,
                    batch_size=batch_size, max_steps=max_steps, eval_every=eval_every, checkpoint_every=0)
    rounds, dp = int(rounds), algorithm.dp
    event = privacy_event(dp, sampler, rounds) if dp.is_private else None
    executed = (privacy_event(dp, sampler, rounds, simulated=False)
                if dp.is_private and dp.noise_cohort_size is not None else None)
    for a, ledger in enumerate(ledgers):
        if not dp.is_private:
            if ledger is not None:
                raise PrivacyAccountingError(f"arm {a}: the algorithm is not private; pass ledger None")
            continue
        if ledger is None:
            raise PrivacyAccountingError(f"arm {a}: a private algorithm needs a ledger per arm")
        if ledger.entry(stage) is not None:
            raise PrivacyAccountingError(f"arm {a}: the ledger already has an entry {stage!r}")
    k_init, k_rounds = tagged_key(seed, stage, "init"), tagged_key(seed, stage, "rounds")
    states = stack([algorithm.init(p, k_init) for p in init_params])
    for ledger in ledgers:  # after every arm initialised: a bad arm charges nothing
        if ledger is not None:
            details = _entry_details(dp, sampler, rounds, executed)
            ledger.spend(stage, event, tuple(populations), note=f"{rounds} rounds (one of {n} arms)",
                         details=details)
    executor = CohortExecutor(algorithm, dataset, batch_size=batch_size, max_steps=max_steps,
                              capacity=int(sampler.max_cohort_size), variable_cohort=bool(sampler.variable_cohort),
                              lanes=lanes, batching=batching)
    executor.set_params_size(init_params[0])
    step = jax.jit(jax.vmap(lambda st, lanes_, mask, key, first: algorithm.apply(st, lanes_, mask, key, first),
                            in_axes=(0, None, None, None, None)))
    history, evals = [[] for _ in range(n)], [[] for _ in range(n)]
    for r in tqdm(range(rounds), disable=not progress, desc=f"rounds ({n} arms)", dynamic_ncols=True):
        ids = [client_ids[i] for i in sampler.sample(r)]
        packed = executor.pack(ids, rng=np.random.default_rng([seed, r]))
        first = None if packed.first is None else packed.first
        states, metrics = step(states, packed.lanes, packed.client_mask, jax.random.fold_in(k_rounds, r), first)
        per_arm = unstack(metrics, n)
        params = unstack(states.params, n) if eval_fn is not None else None
        for a in range(n):
            row = {"round": r + 1, **scalarize({**per_arm[a], "real_steps": packed.real_steps,
                                                "executed_steps": packed.executed_steps}, derived_metrics)}
            if eval_fn is not None and ((eval_every and (r + 1) % eval_every == 0) or r + 1 == rounds):
                ev = {"round": r + 1, **{f"eval_{k}": v for k, v in eval_fn(params[a]).items()}}
                if ledgers[a] is not None:
                    ev["epsilon_spent"] = ledgers[a].spent()
                row.update(ev)
                evals[a].append(ev)
            history[a].append(row)
    accounted = dp.is_private
    return [TrainResult(s, ledgers[a], history[a], evals[a], 0, event if accounted else None,
                        executed if accounted else None, rounds)
            for a, s in enumerate(unstack(states, n))]

