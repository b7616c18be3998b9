"""The private vote release of PrE-Text (Hou et al., ICML 2024, Alg. 1), its accounting and the
post-processing that keeps the well-voted synthetic samples.

One voting round ``t`` (:func:`release_round`):

1. the cohort is drawn by the plan's sampler (``sampler.sample(t)``: Poisson or fixed-size,
   :mod:`fedpriv.fl.samplers`) -- the same object whose amplification is charged;
2. every sampled client computes its bounded vote vector ``v_u`` ``[N]`` (norm <= 1,
   :mod:`fedpriv.synth.votes`) and adds a noise share ``N(0, z^2 / m)`` per coordinate; the
   server only sees the secure-aggregation sum ``sum_u v_u + N(0, z^2 I_N)`` (the Gaussian
   mechanism at noise multiplier ``z`` on a sum of L2 sensitivity 1 under add/remove).  The
   shares are drawn by the same code as FreD's releases (:func:`fedpriv.dp.moments.
   secure_sum_mean` with its :func:`~fedpriv.dp.moments.noise_share`: client ``i``'s share from
   ``fold_in(k_t, i)``), which also clips each vote vector to norm 1 again (a no-op for
   :func:`~fedpriv.synth.votes.client_votes`; it keeps the sensitivity for any vote function).
   An empty cohort (possible under Poisson sampling) is released as one empty client holding the
   whole ``N(0, z^2)``, so the release always carries the noise the accounting assumes.
3. The round key is ``k_t = tagged_key(key, "pretext-votes", name, t)`` (:func:`votes_noise_key`;
   keys carry their purpose, docs/design.md): no two rounds, and no other release from the same
   root key, share noise.  A plan refuses to release the same round twice.

Accounting (:func:`votes_event`): one round over a sampled cohort is one Gaussian release
``GaussianDpEvent(z)`` amplified by the sampler, ``T`` rounds compose -- built by the engine's
own ``GaussianMechanism(clip_norm=1, z).privacy_event(sampler, T)`` (:mod:`fedpriv.dp.
mechanisms`), i.e. ``sampler.amplified_event(RoundRelease(fresh=GaussianDpEvent(z)), T)``:

* ``PoissonSampler`` (add/remove): ``T x PoissonSampledDpEvent(q, GaussianDpEvent(z))``;
* ``UniformSampler`` (fixed size, replace-one): ``T x SampledWithoutReplacementDpEvent(N_pop,
  m, GaussianDpEvent(z / 2))`` -- the replace-one multiplier assumes a replace-one sensitivity
  of 2; the votes' is ``sqrt(2)`` (non-negative unit vectors), so this is conservative.

:func:`plan_votes` charges that event for all ``T`` rounds to a :class:`~fedpriv.dp.ledger.
PrivacyLedger` **before** any private data is touched (the ledger raises
``PrivacyBudgetExceeded`` and records nothing when it would go over budget) and returns the
:class:`VotePlan` without which no round can be released (fail closed).

Post-processing: everything after the noisy sum -- :func:`select_samples` (keep the top-voted
fraction, or those above a threshold), and later the LLM's variations of the kept samples --
reads only the released noisy sum and public data, so it costs no privacy and is never charged.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.dp import moments
from fedpriv.dp.keys import tagged_key
from fedpriv.dp.mechanisms import GaussianMechanism
from fedpriv.synth import votes as V

__all__ = ["VOTE_TAG", "votes_noise_key", "votes_mechanism", "votes_event", "VotePlan",
           "VoteRelease", "plan_votes", "noisy_vote_sum", "release_round", "select_samples"]

VOTE_TAG = "pretext-votes"


def votes_noise_key(key, round_idx: int, name: str = "pretext") -> jax.Array:
    """Round ``round_idx``'s noise key: ``tagged_key(key, "pretext-votes", name, round_idx)``;
    client ``i``'s share is drawn from ``fold_in(·, i)`` (``moments.noise_share``)."""
    return tagged_key(key, VOTE_TAG, name, int(round_idx))


def votes_mechanism(noise_multiplier: float) -> GaussianMechanism:
    """The Gaussian mechanism of one vote round: sensitivity ``votes.SENSITIVITY`` (= 1),
    fresh noise of std ``z`` on the sum every round."""
    return GaussianMechanism(clip_norm=V.SENSITIVITY, noise_multiplier=float(noise_multiplier))


def votes_event(sampler, rounds: int, noise_multiplier: float) -> dpa.DpEvent:
    """The ``dp_accounting`` event of ``rounds`` vote rounds at multiplier ``z`` under
    ``sampler`` (module docstring); ``NonPrivateDpEvent`` for ``z = 0`` (a ledger refuses it)."""
    return votes_mechanism(noise_multiplier).privacy_event(sampler, int(rounds))


@dataclasses.dataclass
class VotePlan:
    """What a ledger was charged for: ``rounds`` vote rounds at multiplier ``noise_multiplier``
    on cohorts of ``sampler``, ``k`` votes per message, noise from ``key``; only
    :func:`plan_votes` makes one. ``released``: the rounds already released (each at most once).
    """
    sampler: object
    rounds: int
    noise_multiplier: float
    key: jax.Array
    event: dpa.DpEvent
    k: int = 1
    name: str = "pretext"
    chunk_size: int = 256
    released: set = dataclasses.field(default_factory=set)

    @property
    def noise_std(self) -> float:
        """Std of the noise on the released sum: ``z * sensitivity``."""
        return self.noise_multiplier * V.SENSITIVITY


@dataclasses.dataclass(frozen=True)
class VoteRelease:
    """One round's release: ``noisy_votes [N]`` float64 (the only DP output), the round, the
    noise std on the sum, and ``num_clients`` (the cohort size m: known to the server running
    secure aggregation; ``nonprivate`` under Poisson sampling, for diagnostics only)."""
    round_idx: int
    noisy_votes: np.ndarray
    noise_std: float
    num_clients: int


def plan_votes(ledger, sampler, rounds: int, noise_multiplier: float, key, *, k: int = 1,
               name: str = "pretext", populations: Iterable[str] = ("users",),
               chunk_size: int = 256) -> VotePlan:
    """Charge ``rounds`` vote rounds to ``ledger`` (before any private data) and return the plan.

    Args:
      ledger: a ``PrivacyLedger``; its neighbouring relation must be the sampler's (Poisson:
        add/remove, fixed-size: replace-one), else the event would be read in the wrong units.
      sampler: draws every round's cohort (``sample(t)``) and amplifies (``amplified_event``).
      rounds: T >= 1; noise_multiplier: z > 0 (std of the sum's noise over the sensitivity 1).
      key: root PRNG key (``jax.random.key``); the rounds use :func:`votes_noise_key`.
      k: votes per message; name: the ledger entry's name (also folded into the keys);
      chunk_size: messages per chunk in the vote computation (a memory knob, no privacy effect).
    Raises:
      PrivacyBudgetExceeded (nothing recorded) if the T rounds would exceed the budget; the
      ledger also refuses z = 0 (a non-private event).
    """
    if key is None:
        raise ValueError("plan_votes needs an explicit PRNG key (jax.random.key(seed))")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    rel, lrel = getattr(sampler, "neighboring", None), getattr(ledger, "neighboring", None)
    if rel is not None and lrel is not None and rel != lrel:
        raise ValueError(f"the sampler's neighbours are {rel!r} but the ledger accounts "
                         f"{lrel!r}: the event would be read in the wrong units")
    event = votes_event(sampler, rounds, noise_multiplier)
    ledger.spend(f"{name}-votes", event, populations=tuple(populations),
                 details={"rounds": int(rounds), "noise_multiplier": float(noise_multiplier),
                          "k": k, "sampler": type(sampler).__name__,
                          "sensitivity": V.SENSITIVITY, "unit": "user"})
    return VotePlan(sampler=sampler, rounds=int(rounds), noise_multiplier=float(noise_multiplier),
                    key=key, event=event, k=k, name=name, chunk_size=int(chunk_size))


def noisy_vote_sum(votes, noise_multiplier: float, key) -> jax.Array:
    """Secure-aggregation sum of ``votes [m, N]`` plus shares ``N(0, z^2/m)`` from each of the
    ``m`` clients (``moments.secure_sum_mean``, the FreD releases' code; client ``i``'s share
    from ``fold_in(key, i)``; each row clipped to norm ``SENSITIVITY``). Returns ``[N]``."""
    votes = jnp.asarray(votes, jnp.float32)
    m, n = votes.shape
    if m < 1:
        raise ValueError("a release needs at least one share holder")
    c = moments.GROUP * -(-m // moments.GROUP)
    emb = jnp.zeros((c, 1, n), jnp.float32).at[:m, 0].set(votes)
    real = (jnp.arange(c) < m).astype(jnp.float32)
    return moments.secure_sum_mean(emb, real[:, None], jnp.ones((c,), jnp.float32),
                                   jnp.arange(c, dtype=jnp.int32), real, V.SENSITIVITY,
                                   float(noise_multiplier) * V.SENSITIVITY, m, key)


def release_round(plan: VotePlan, round_idx: int,
                  clients: Sequence | Callable[[int], np.ndarray], synth) -> VoteRelease:
    """One DP vote round (module docstring).

    Args:
      plan: from :func:`plan_votes` (the ledger was charged for it).
      round_idx: t in ``[0, plan.rounds)``, each at most once.
      clients: the population's embeddings: ``clients[i]`` or ``clients(i)`` -> ``[n_i, d]``;
        only the cohort ``plan.sampler.sample(t)`` is read.
      synth: ``[N, d]`` the synthetic samples' embeddings (public).
    Returns:
      :class:`VoteRelease` with ``noisy_votes [N]``.
    """
    if not isinstance(plan, VotePlan):
        raise TypeError("release_round needs the VotePlan of plan_votes (the ledger's charge)")
    t = int(round_idx)
    if not 0 <= t < plan.rounds:
        raise ValueError(f"round {t} is outside the {plan.rounds} rounds charged to the ledger")
    if t in plan.released:
        raise ValueError(f"round {t} was released already: a second release would reuse its noise")
    synth = np.asarray(synth, np.float32)
    if synth.ndim != 2 or synth.shape[0] < plan.k:
        raise ValueError(f"synth must be [N >= k={plan.k}, d], got {synth.shape}")
    if not np.all(np.isfinite(synth)):
        raise ValueError("synthetic embeddings contain NaN/inf")
    cohort = np.asarray(plan.sampler.sample(t))
    get = clients if callable(clients) else clients.__getitem__
    arrays = [np.asarray(get(int(i)), np.float32) for i in cohort]
    plan.released.add(t)  # from here on private data is read: the round is spent
    arrays = arrays or [np.zeros((0, synth.shape[1]), np.float32)]  # empty cohort: one share
    for i, a in enumerate(arrays):
        if a.shape[0] and not np.all(np.isfinite(a)):
            raise ValueError(f"cohort client {i}: embeddings contain NaN/inf")
    emb, mask, owner, slots = V.pack_messages(arrays, synth.shape[1], plan.chunk_size)
    votes = V.chunked_votes(jnp.asarray(emb), jnp.asarray(mask), jnp.asarray(owner),
                            jnp.asarray(synth), plan.k, slots)[: len(arrays)]
    noisy = noisy_vote_sum(votes, plan.noise_multiplier,
                           votes_noise_key(plan.key, t, plan.name))
    return VoteRelease(round_idx=t, noisy_votes=np.asarray(noisy, np.float64),
                       noise_std=plan.noise_std, num_clients=len(cohort))


def select_samples(noisy_votes, *, keep_fraction: float | None = None,
                   threshold: float | None = None) -> np.ndarray:
    """Post-processing of one release: the indices of the synthetic samples to keep, most
    voted first. Exactly one of ``keep_fraction`` (the top ``ceil(f N)``, f in (0, 1]) or
    ``threshold`` (noisy votes >= H, as Private Evolution's H) is given. ``[N] -> [kept]``."""
    v = np.asarray(noisy_votes, np.float64)
    if v.ndim != 1:
        raise ValueError(f"noisy_votes must be [N], got {v.shape}")
    if (keep_fraction is None) == (threshold is None):
        raise ValueError("give exactly one of keep_fraction and threshold")
    order = np.argsort(-v, kind="stable")
    if keep_fraction is not None:
        if not 0 < keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
        return order[: max(1, math.ceil(keep_fraction * v.shape[0]))]
    return order[v[order] >= float(threshold)]
