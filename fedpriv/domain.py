"""Population expansion for private FL of LMs (Koga et al. 2023, population_expansion_koga2023.md).

A target domain T with a small population is trained together with a larger source domain S.
This module holds the paper's primitives that are independent of the FL engine:

1. **Private unigram frequencies** u_hat_pi per domain pi in {S, T} (Sec. 3.2 "Instance weighting",
   Sec. 4.2): each user contributes at most ``max_sequences`` = 5 sequences of
   ``max_tokens_per_sequence`` = 10 tokens, so under add/remove-one-user the count vector moves by
   at most Delta = 5 * 10 = 50 in L1; the counts are released with the two-sided Geometric
   mechanism (`fedpriv.dp.geometric`) at eps0 (the paper: (eps0, delta0) = (0.8, 0)), clipped at 0
   and normalised with an add-beta floor. The spend goes to the privacy ledger *before* any data is
   read.
2. **Unigram sequence densities and the relative importance weight of Eq. 3**,
   p_hat_pi(x) = prod_i u_hat_pi(x_i),
   w(x) = p_hat_T(x) / (alpha p_hat_T(x) + (1 - alpha) p_hat_pi(x)),    (Eq. 3)
   the weight of the instance-weighted objective E_{x ~ S u T}[w(x) L(x)] (Eq. 2), computed in log
   space, with optional bounding.
3. **Domain-adaptation dataset assembly**: the union of a source and a target federated dataset,
   per-example domain ids, per-client population labels (users with T data are T-clients),
   alpha, a seeded stratified 6:2:2 client split (Sec. 4.1-4.2), and the App. A preprocessing
   (a word vocabulary — the paper's is T's training texts, known in advance; the experiment's
   default is the public pool's, see below; [BOS] + words + [EOS] cut into
   sequences of 10 targets; at most 1,600 words per user).
4. **The training schemes of Table 1** as data (populations, cohort C or alpha*C, weighting,
   pretrain/finetune rounds, model variant, privacy budget split).
5. **The latency model of Prop. 3.1 (Eq. 1, App. B)**: the exact expectation of the time to wait
   for k = C - Npq of m = N - Np unavailable devices, its lower and upper bounds, and a Monte Carlo
   simulator of exponential availability clocks.

Conventions. Token ids PAD = 0, UNK = 1, BOS = 2, EOS = 3. A client's LM examples are
``tokens: int32[n, L+1]``: position 0 is the input-only start (BOS for a sentence start) and
positions 1..L are the prediction targets. Host-side NumPy throughout; randomness is an explicit
``np.random.Generator`` (or an integer seed for the client split).

Which tokens are "x". The unigram model is a model of what the LM predicts: the *target positions*
``tokens[:, 1:]``, excluding PAD (padding, no loss) and BOS (an input marker that is never a
target, and whose frequency only encodes how sequences were cut). EOS and UNK are predicted by the
LM and are counted and scored like words. The same positions are counted for u_hat and scored for
p_hat, so u_hat is a distribution over exactly the tokens that enter the density; with the App. A
rows of `chunk_sentence` every word of a sentence is a target in exactly one row.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
from dp_accounting import dp_event

from fedpriv.data.federated import FederatedDataset, encode_examples
from fedpriv.dp import geometric, keys

__all__ = [
    "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "SOURCE", "TARGET", "DEFAULT_IGNORE_IDS",
    "UNIGRAM_MAX_SEQUENCES", "UNIGRAM_MAX_TOKENS_PER_SEQUENCE", "unigram_sensitivity",
    "bounded_user_counts", "unigram_counts", "private_unigram_frequencies", "normalise_counts",
    "domain_unigram_frequencies",
    "sequence_log_density", "relative_log_weights", "importance_weights", "bound_weights",
    "add_importance_weights",
    "DomainDataset", "assemble_domain_dataset", "encode_domain_dataset", "chunk_sentence",
    "KOGA_SEQ_LEN", "KOGA_MAX_TOKENS_PER_CLIENT", "split_clients",
    "select_clients",
    "Stage", "TrainingScheme", "PlannedSpend", "TOTAL_BUDGET", "UNIGRAM_BUDGET",
    "IW_TRAINING_BUDGET", "TRAINING_SCHEMES", "SCHEMES_BY_NAME", "schemes_markdown",
    "latency_counts", "expected_kth_arrival", "expected_latency", "latency_lower_bound",
    "latency_upper_bound", "latency_upper_bound_tight", "LatencyEstimate", "simulate_kth_arrival",
    "simulate_latency",
]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SOURCE, TARGET = 0, 1  # domain ids of examples and population labels of clients
DEFAULT_IGNORE_IDS = (PAD_ID, BOS_ID)

UNIGRAM_MAX_SEQUENCES = 5  # Sec. 4.2: "at most 5 sequences ..."
UNIGRAM_MAX_TOKENS_PER_SEQUENCE = 10  # "... with each of which have a fixed length of 10 tokens"


class Ledger(Protocol):
    """The part of `fedpriv.dp.ledger.PrivacyLedger` used here."""

    def spend(self, name: str, event: dp_event.DpEvent, populations: tuple[str, ...]) -> Any: ...


# ---------------------------------------------------------------------------------------------
# 1. Private unigram frequencies (Sec. 3.2, Sec. 4.2)
# ---------------------------------------------------------------------------------------------


def unigram_sensitivity(max_sequences: int = UNIGRAM_MAX_SEQUENCES,
                        max_tokens_per_sequence: int = UNIGRAM_MAX_TOKENS_PER_SEQUENCE) -> int:
    """L1 sensitivity of the summed count vector under add/remove-one-user.

    Each user adds at most ``max_sequences * max_tokens_per_sequence`` unit increments to the
    vector of token counts (`bounded_user_counts`), and users are independent, so adding or
    removing one user changes the sum by a non-negative vector of L1 norm at most that product:
    5 * 10 = 50 in the paper. Under replace-one-user it is twice that (100): one user's 50
    counts leave, another's 50 arrive (`private_unigram_frequencies` uses the ledger's relation).
    """
    for v, nm in ((max_sequences, "max_sequences"),
                  (max_tokens_per_sequence, "max_tokens_per_sequence")):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"{nm} must be a positive integer, got {v!r}")
    return int(max_sequences) * int(max_tokens_per_sequence)


def _target_positions(tokens: np.ndarray, targets_only: bool) -> np.ndarray:
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be an integer array, got dtype {tokens.dtype}")
    if tokens.ndim < 1:
        raise ValueError("tokens must have a sequence axis")
    return tokens[..., 1:] if targets_only else tokens


def _counted_mask(x: np.ndarray, ignore_ids: Sequence[int]) -> np.ndarray:
    return ~np.isin(x, np.asarray(tuple(ignore_ids), dtype=x.dtype))


def bounded_user_counts(
    tokens: np.ndarray,
    vocab_size: int,
    rng: np.random.Generator,
    *,
    max_sequences: int = UNIGRAM_MAX_SEQUENCES,
    max_tokens_per_sequence: int = UNIGRAM_MAX_TOKENS_PER_SEQUENCE,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """One user's contribution to the unigram counts: int64[vocab_size], L1 norm <= 5 * 10.

    Args:
      tokens: int[n, L+1] the user's LM examples (or int[n, L] with ``targets_only=False``).
      rng: chooses which ``max_sequences`` rows are used when the user has more rows with a
        counted token (uniformly without replacement; a data-independent rule per user, so the
        sensitivity argument holds).
    Per chosen row, the first ``max_tokens_per_sequence`` counted tokens (target positions,
    not in ``ignore_ids``) are counted. Tokens outside [0, vocab_size) raise ValueError.
    """
    x = _target_positions(tokens, targets_only)
    if x.ndim != 2:
        raise ValueError(f"tokens must be int[n, L+1], got shape {np.shape(tokens)}")
    if x.size and (x.min() < 0 or x.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got range "
                         f"[{x.min()}, {x.max()}]")
    mask = _counted_mask(x, ignore_ids)
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size > max_sequences:
        rows = np.sort(rng.choice(rows, size=max_sequences, replace=False))
    x, mask = x[rows], mask[rows]
    mask &= np.cumsum(mask, axis=1) <= max_tokens_per_sequence
    return np.bincount(x[mask].astype(np.int64), minlength=vocab_size).astype(np.int64)


def _client_rows(value: Any, example_domain: int | None) -> np.ndarray:
    """int[n, L+1] rows of one client given as an array or an example dict."""
    if isinstance(value, Mapping):
        tokens = np.asarray(value["tokens"])
        if example_domain is not None:
            if "domain" not in value:
                raise ValueError("example_domain given but a client dict has no 'domain' field")
            tokens = tokens[np.asarray(value["domain"]) == example_domain]
        return tokens
    if example_domain is not None:
        raise ValueError("example_domain needs client dicts with a 'domain' field")
    return np.asarray(value)


def unigram_counts(
    clients: Mapping[Hashable, Any] | Iterable[Any],
    vocab_size: int,
    rng: np.random.Generator,
    *,
    example_domain: int | None = None,
    max_sequences: int = UNIGRAM_MAX_SEQUENCES,
    max_tokens_per_sequence: int = UNIGRAM_MAX_TOKENS_PER_SEQUENCE,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """Sum of `bounded_user_counts` over users (NOT private): int64[vocab_size].

    ``clients``: client id -> int[n, L+1] tokens or an example dict with 'tokens' (and 'domain',
    used when ``example_domain`` is given to keep only that domain's examples), or an iterable of
    such values. Clients are visited in sorted-id order so a seed fixes the result.
    """
    if isinstance(clients, Mapping):
        values = [clients[c] for c in sorted(clients, key=repr)]
    else:
        values = list(clients)
    total = np.zeros(vocab_size, np.int64)
    for value in values:
        total += bounded_user_counts(
            _client_rows(value, example_domain), vocab_size, rng, max_sequences=max_sequences,
            max_tokens_per_sequence=max_tokens_per_sequence, ignore_ids=ignore_ids,
            targets_only=targets_only)
    return total


def normalise_counts(counts: np.ndarray, *, smoothing: float = 1.0,
                     zero_ids: Sequence[int] = ()) -> np.ndarray:
    """Noisy counts -> u_hat: float64[V]: clip at 0, add a floor of ``smoothing`` pseudo-counts.

    u_hat[v] = (max(c[v], 0) + beta) / (sum_v' max(c[v'], 0) + V beta),  beta = ``smoothing`` > 0,
    so every token has probability >= beta / (sum + V beta) > 0 and log u_hat is finite for every
    sequence (a word with u_hat_T = 0 would give w = 0 to every S-example containing it, one
    with u_hat_S = 0 would give w = 1/alpha, and both 0/0). ``zero_ids`` (e.g. PAD, BOS: never
    counted, so their count is 0 by construction) get only the floor. Pure post-processing of the
    release. With eps0 = 0.8 and Delta = 50 the noise std is ~88 per token, so the clipped noise
    mass (~31 per token) dominates beta = 1; beta only matters for an almost noiseless release.
    """
    smoothing = float(smoothing)
    if not (smoothing > 0 and math.isfinite(smoothing)):
        raise ValueError(f"smoothing must be finite and > 0, got {smoothing!r}")
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    if c.ndim != 1 or c.size == 0:
        raise ValueError("counts must be a non-empty vector")
    if len(zero_ids):
        c[np.asarray(zero_ids)] = 0.0
    c += smoothing
    return c / c.sum()


def private_unigram_frequencies(
    clients: Mapping[Hashable, Any] | Iterable[Any],
    vocab_size: int,
    epsilon: float,
    rng: "np.random.Generator | jax.Array | int",
    *,
    population: str,
    ledger: Ledger | None = None,
    name: str | None = None,
    example_domain: int | None = None,
    max_sequences: int = UNIGRAM_MAX_SEQUENCES,
    max_tokens_per_sequence: int = UNIGRAM_MAX_TOKENS_PER_SEQUENCE,
    smoothing: float = 1.0,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
    neighboring: str | None = None,
) -> np.ndarray:
    """(epsilon, 0)-DP unigram frequencies of one domain's population: u_hat float64[vocab_size].

    Steps: (0) ``ledger.spend(name, DiscreteLaplaceDpEvent(eps/Delta, Delta), populations=(population,))``
    before ``clients`` is read (a refusal, e.g. ``PrivacyBudgetExceeded``, propagates and no data
    is touched); (1) per-user bounded counts (<= 5 sequences x 10 tokens, `bounded_user_counts`),
    summed; (2) two-sided Geometric noise with a = exp(-eps/Delta), Delta = 50, added to every
    coordinate whose count can be non-zero (the ``ignore_ids`` coordinates are 0 whatever the data,
    so releasing them exactly is free); (3) clip at 0, add-``smoothing`` floor, normalise
    (`normalise_counts`).

    Unit of privacy: the user. Neighbouring relation: the ledger's ``neighboring`` (else
    ``neighboring``, default "add_remove"; the two must agree). Delta = 50 under add/remove one
    user of ``population``, 100 under replace-one (`unigram_sensitivity`); the noise is
    calibrated to that Delta, so the release is eps-DP under the relation the ledger composes.
    The S and T
    populations are disjoint sets of users (`assemble_domain_dataset`), so releasing u_hat_S and
    u_hat_T at eps0 each costs eps0 per user by parallel composition (each user is in one).

    Args:
      clients: the population's clients (see `unigram_counts`); with ``example_domain`` only that
        domain's examples are counted.
      epsilon: eps0 of the release (the paper: 0.8). delta0 = 0.
      population: ledger label of the population the users belong to.
      ledger: object with ``spend(name, event, populations)`` (and ``neighboring``); None = no
        ledger.
      rng: a ``np.random.Generator`` (its stream chooses the bounded rows, then draws the
        noise), or a JAX PRNG key / int seed: then the row choice and the noise come from
        ``keys.numpy_generator(key, "unigram", population, "rows" | "noise")`` — keys carrying
        their purpose (DESIGN.md), so no other release ever draws the same noise.
      neighboring: "add_remove" or "replace_one"; default: the ledger's, else "add_remove".
    """
    if isinstance(vocab_size, bool) or int(vocab_size) != vocab_size or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    ledger_rel = getattr(ledger, "neighboring", None) if ledger is not None else None
    if neighboring is None:
        neighboring = ledger_rel or "add_remove"
    if neighboring not in ("add_remove", "replace_one"):
        raise ValueError(f"neighboring must be 'add_remove' or 'replace_one', got {neighboring!r}")
    if ledger_rel is not None and ledger_rel != neighboring:
        raise ValueError(f"release relation {neighboring!r} differs from the ledger's "
                         f"{ledger_rel!r}: the noise would be calibrated to the wrong sensitivity")
    sensitivity = unigram_sensitivity(max_sequences, max_tokens_per_sequence)
    if neighboring == "replace_one":
        sensitivity *= 2  # one user's counts leave and another's arrive
    event = geometric.geometric_dp_event(epsilon, sensitivity)
    if isinstance(rng, np.random.Generator):
        rows_rng = noise_rng = rng
    else:
        rows_rng = keys.numpy_generator(rng, "unigram", population, "rows")
        noise_rng = keys.numpy_generator(rng, "unigram", population, "noise")
    if ledger is not None:
        ledger.spend(name or f"unigram_frequencies[{population}]", event,
                     populations=(population,))
    counts = unigram_counts(
        clients, vocab_size, rows_rng, example_domain=example_domain, max_sequences=max_sequences,
        max_tokens_per_sequence=max_tokens_per_sequence, ignore_ids=ignore_ids,
        targets_only=targets_only)
    live = np.ones(vocab_size, bool)
    ignored = [i for i in ignore_ids if 0 <= i < vocab_size]
    live[ignored] = False
    noisy = counts.copy()
    noisy[live] = geometric.geometric_mechanism(counts[live], noise_rng, epsilon, sensitivity)
    return normalise_counts(noisy, smoothing=smoothing, zero_ids=ignored)


def domain_unigram_frequencies(
    ds: "DomainDataset",
    vocab_size: int,
    epsilon: float,
    rng: "np.random.Generator | jax.Array | int",
    *,
    ledger: Ledger | None = None,
    labels: Mapping[int, str] | None = None,
    split: str = "train",
    **kwargs,
) -> tuple[np.ndarray, np.ndarray]:
    """(u_hat_S, u_hat_T), float64[V] each, at (epsilon, 0) per population (Sec. 3.2 step (1)).

    u_hat_S counts the S-population clients' source examples and u_hat_T the T-population
    clients' target examples; each release is charged to its own population (``labels``, default
    "S"/"T"), so every user pays epsilon once (parallel composition). The source examples of
    T-clients (``overlap="target"``) are deliberately not counted in u_hat_S: that would charge T
    users for both releases. ``kwargs`` go to `private_unigram_frequencies`.
    """
    labels = {SOURCE: "S", TARGET: "T"} if labels is None else dict(labels)
    out = []
    for pop in (SOURCE, TARGET):
        out.append(private_unigram_frequencies(
            _LazyClients(ds, split, pop), vocab_size, epsilon, rng, population=labels[pop],
            ledger=ledger, name=f"unigram_frequencies[{labels[pop]}]", **kwargs))
    return out[0], out[1]


class _LazyClients(Mapping):
    """``ds.clients(split, (pop,), (pop,))``, built only when first read (after the ledger)."""

    def __init__(self, ds, split, pop):
        self._args = (ds, split, pop)
        self._value = None

    def _get(self):
        if self._value is None:
            ds, split, pop = self._args
            self._value = ds.clients(split, (pop,), (pop,))
        return self._value

    def __getitem__(self, key):
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())


# ---------------------------------------------------------------------------------------------
# 2. Unigram densities and relative importance weights (Eq. 2, Eq. 3)
# ---------------------------------------------------------------------------------------------


def sequence_log_density(
    tokens: np.ndarray,
    u_hat: np.ndarray,
    *,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """log p_hat(x) = sum_i log u_hat(x_i) over counted tokens: float64[...] for int[..., L+1].

    x = the target positions ``tokens[..., 1:]`` minus PAD and BOS (``targets_only=False`` scores
    every position). ``u_hat`` must be strictly positive (e.g. from `normalise_counts`). A sequence
    with no counted token has log p_hat = 0 (p_hat = 1, so w = 1 for it in Eq. 3).
    """
    u_hat = np.asarray(u_hat, dtype=np.float64)
    if u_hat.ndim != 1 or np.any(~(u_hat > 0)):
        raise ValueError("u_hat must be a vector of strictly positive probabilities")
    x = _target_positions(tokens, targets_only)
    if x.size and (x.min() < 0 or x.max() >= u_hat.shape[0]):
        raise ValueError(f"token ids must lie in [0, {u_hat.shape[0]})")
    log_u = np.log(u_hat)
    mask = _counted_mask(x, ignore_ids)
    return np.where(mask, log_u[x], 0.0).sum(axis=-1)


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not (0.0 < alpha <= 1.0):
        raise ValueError(f"alpha (fraction of devices with target data) must be in (0, 1], "
                         f"got {alpha!r}")
    return alpha


def relative_log_weights(log_p_target: np.ndarray, log_p_own: np.ndarray,
                         alpha: float) -> np.ndarray:
    """log w of Eq. 3: log p_T - log(alpha p_T + (1 - alpha) p_pi); float64 of the broadcast shape.

    Evaluated as  log w = -logaddexp(log alpha, log(1 - alpha) + (log p_pi - log p_T)),
    which only involves the log-density *difference* d: exact for log-densities of -1000 or less
    (where p itself underflows), and monotone: w -> 1/alpha as d -> -inf, w -> 0 as d -> +inf,
    w = 1 at d = 0. So w in (0, 1/alpha] (exp of a log weight below about -745 in float64, or
    -103 in float32, rounds to 0: such an example is effectively dropped from the objective).
    """
    alpha = _check_alpha(alpha)
    d = np.asarray(log_p_own, np.float64) - np.asarray(log_p_target, np.float64)
    if alpha == 1.0:
        return np.zeros_like(d)
    return -np.logaddexp(math.log(alpha), math.log1p(-alpha) + d)


def bound_weights(w: np.ndarray, alpha: float, *, mode: str = "none",
                  w_max: float | None = None) -> np.ndarray:
    """Optional bounding of Eq. 3 weights w in (0, 1/alpha]; same shape and dtype as ``w``.

    modes: "none" (w as is), "scale" (alpha * w in (0, 1]: a constant factor, so the same
    minimiser of Eq. 2, and no per-example gradient is ever larger than unweighted),
    "clip" (min(w, w_max), w_max > 0: biased, but bounds the largest up-weighting).

    Why the privacy analysis does not change: the weights only rescale per-example losses inside
    a client's local training, and DP-FedAvg/DP-FTRL clip each client's *model delta* to norm S
    afterwards, so one user's contribution to the aggregate is bounded by S whatever objective the
    client optimised (the sensitivity is a property of the clip, not of the loss). The weights are
    a function of the client's own examples and of u_hat, which is a DP release already charged to
    the ledger (post-processing), and of alpha, a public population count. Bounding them is for
    optimisation (w up to 1/alpha = 10 multiplies the effective local step, makes deltas hit the
    clip more often and so biases the clipped average), not for privacy.
    """
    alpha = _check_alpha(alpha)
    w = np.asarray(w)
    if mode == "none":
        return w
    if mode == "scale":
        return (w * alpha).astype(w.dtype)
    if mode == "clip":
        if w_max is None or not (w_max > 0):
            raise ValueError("mode='clip' needs w_max > 0")
        return np.minimum(w, np.asarray(w_max, w.dtype))
    raise ValueError(f"mode must be 'none', 'scale' or 'clip', got {mode!r}")


def importance_weights(
    tokens: np.ndarray,
    domain: np.ndarray,
    u_source: np.ndarray,
    u_target: np.ndarray,
    alpha: float,
    *,
    mode: str = "none",
    w_max: float | None = None,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """Per-example weights of Eq. 3 for one client: float32[n] (the example dict's 'weight').

    Args:
      tokens: int[n, L+1]; domain: int[n] with SOURCE = 0 / TARGET = 1 (pi of each example).
      u_source, u_target: private unigram frequencies float[V] of S and T.
      alpha: fraction of devices with target-domain data (`DomainDataset.alpha`).
      mode, w_max: `bound_weights`.
    Target examples get w = 1 exactly (Eq. 3 with pi = T is 1/(alpha + 1 - alpha)); source
    examples w = 1/(alpha + (1 - alpha) p_hat_S(x)/p_hat_T(x)) from log-space densities.
    """
    domain = np.asarray(domain)
    tokens = np.asarray(tokens)
    if domain.shape != tokens.shape[:1]:
        raise ValueError(f"domain must be int[n] for tokens of shape {tokens.shape}")
    if np.any((domain != SOURCE) & (domain != TARGET)):
        raise ValueError("domain ids must be SOURCE (0) or TARGET (1)")
    kw = dict(ignore_ids=ignore_ids, targets_only=targets_only)
    log_pt = sequence_log_density(tokens, u_target, **kw)
    log_ps = sequence_log_density(tokens, u_source, **kw)
    log_w = relative_log_weights(log_pt, log_ps, alpha)
    w = np.where(domain == TARGET, 1.0, np.exp(log_w))
    return bound_weights(w.astype(np.float32), alpha, mode=mode, w_max=w_max)


def add_importance_weights(
    clients: Mapping[Hashable, Mapping[str, Any]],
    u_source: np.ndarray,
    u_target: np.ndarray,
    alpha: float,
    **kwargs,
) -> Mapping[Hashable, dict[str, Any]]:
    """Clients with 'weight': float32[n] added next to 'tokens' and 'domain' (inputs unchanged).

    ``clients``: client id -> {'tokens': int[n, L+1], 'domain': int[n], ...}; a
    `fedpriv.data.federated.FederatedDataset` gives a FederatedDataset back. ``kwargs`` go to
    `importance_weights` (mode, w_max, ...).
    """
    out = {}
    for cid, ex in clients.items():
        new = dict(ex)
        new["weight"] = importance_weights(ex["tokens"], ex["domain"], u_source, u_target, alpha,
                                           **kwargs)
        out[cid] = new
    return _like(clients, out)


# ---------------------------------------------------------------------------------------------
# 3. Domain-adaptation dataset assembly (Sec. 4.1, 4.2, App. A)
# ---------------------------------------------------------------------------------------------


def _like(template: Any, clients: dict) -> Any:
    """``clients`` as a FederatedDataset if ``template`` is one (same vocab/batch size/name)."""
    if isinstance(template, FederatedDataset):
        if not clients:
            raise ValueError("no client left")
        return FederatedDataset.from_clients(
            clients, vocab_size=template.vocab_size, batch_size=template.batch_size,
            info=template.info, name=template.name)
    return clients


@dataclasses.dataclass(frozen=True)
class DomainDataset:
    """Union of a source and a target federated dataset, split by client.

    ``train``/``val``/``test``: client id -> example dict with 'domain': int32[n] (SOURCE/TARGET of
    each example, the ``batch['domain']`` the DSDSR/DEMix models read) and either 'tokens'
    int32[n, L+1] (a `FederatedDataset`, ready for the FL engine) or 'texts' list[str] (a dict;
    tokenize with `encode_domain_dataset`). ``population``: client id -> SOURCE or TARGET.
    ``alpha``: fraction of *training* clients in the target population (Sec. 3.2: "the proportion
    of the devices with data from T"); the split is stratified, so val/test match it up to
    rounding. Population sizes are treated as public (the server knows which application a
    device runs), so alpha costs no privacy budget.
    """

    train: Mapping
    val: Mapping
    test: Mapping
    population: dict
    alpha: float
    overlap: str

    def split(self, name: str) -> Mapping:
        if name not in ("train", "val", "test"):
            raise ValueError(f"split must be train, val or test, got {name!r}")
        return getattr(self, name)

    def num_clients(self, split: str = "train", population: int | None = None) -> int:
        d = self.split(split)
        return len(d) if population is None else sum(
            self.population[c] == population for c in d)

    def clients(self, split: str, populations: Sequence[int] = (SOURCE, TARGET),
                example_domains: Sequence[int] = (SOURCE, TARGET)) -> Mapping:
        """`select_clients` on one split: e.g. a T-only stage's training clients are
        ``clients("train", (TARGET,), (TARGET,))``."""
        return select_clients(self.split(split), self.population, populations, example_domains)

    def texts(self, split: str = "train", domain: int = TARGET) -> list[str]:
        """All ``domain`` texts of a string dataset's split, e.g. to build the vocabulary from
        the target domain's training data (App. A; the paper treats that vocabulary as known in
        advance). That vocabulary is a release of the target users' data: the experiment uses
        the public pool's by default, and records this one as a non-private ledger entry
        (``PrivacyLedger.record_nonprivate``; ``experiments.population_expansion``)."""
        out = []
        for ex in self.split(split).values():
            if "texts" not in ex:
                raise ValueError("texts() needs a dataset assembled from strings")
            out += [t for t, d in zip(ex["texts"], ex["domain"]) if d == domain]
        return out


def _as_examples(values: Any) -> tuple[str, Any]:
    """('texts', list[str]) or ('tokens', int32[n, L+1]) for one client's examples."""
    if isinstance(values, Mapping):
        if "tokens" not in values:
            raise ValueError("a client dict must have 'tokens'")
        values = np.asarray(values["tokens"])
    if isinstance(values, np.ndarray):
        if values.ndim != 2 or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                f"token examples must be int[n, L+1], got {values.dtype}{values.shape}")
        return "tokens", values.astype(np.int32)
    if isinstance(values, str):
        raise ValueError("a client's examples must be a list of strings, not one string")
    values = list(values)
    if all(isinstance(v, str) for v in values):
        return "texts", values
    arr = np.asarray(values)
    if arr.ndim == 2 and np.issubdtype(arr.dtype, np.integer):
        return "tokens", arr.astype(np.int32)
    raise ValueError("a client's examples must be a list of strings or an int array [n, L+1]")


def _split_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """Largest-remainder rounding of n * fractions (sums to n)."""
    raw = [n * f for f in fractions]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def split_clients(client_ids: Iterable[Hashable], seed: int,
                  fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> tuple[list, list, list]:
    """Seeded random split of client ids into train/val/test (default 6:2:2, Sec. 4.2).

    Ids are sorted (by repr) before shuffling with ``np.random.default_rng(seed)``, so the split
    depends only on the set of ids and the seed. Sizes: largest-remainder rounding of n * fraction.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1):
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, "
                         f"got {fractions!r}")
    ids = sorted(client_ids, key=repr)
    perm = np.random.default_rng(seed).permutation(len(ids))
    ids = [ids[i] for i in perm]
    n_train, n_val, _ = _split_counts(len(ids), fractions)
    return ids[:n_train], ids[n_train:n_train + n_val], ids[n_train + n_val:]


_OVERLAP_MODES = ("target", "target_examples", "drop")


def _make_split(kind: str, clients: dict, name: str) -> Mapping:
    if kind == "texts" or not clients:
        return clients
    return FederatedDataset.from_clients(clients, name=name)


def _alpha(train: Mapping, population: Mapping) -> float:
    n_train = len(train)
    n_t = sum(population[c] == TARGET for c in train)
    if n_train == 0 or n_t == 0:
        raise ValueError(f"the training split needs target clients (train: {n_train} clients, "
                         f"{n_t} target)")
    return n_t / n_train


def assemble_domain_dataset(
    source: Mapping[Hashable, Any],
    target: Mapping[Hashable, Any],
    *,
    seed: int,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    overlap: str = "target",
) -> DomainDataset:
    """Build the S u T federated dataset of Koga et al. from two client-keyed datasets.

    Args:
      source, target: client id -> that user's examples in the domain: list[str] (e.g. a
        `fedpriv.data.text.FederatedText`), int[n, L+1], or a dict with 'tokens' (e.g. a
        `FederatedDataset`); both must be strings or both tokens. A key present in both mappings is
        ONE user with data in both domains (the SubReddits case); callers whose id spaces are
        unrelated (e.g. Simpsons speakers vs chitchat senders) must make them disjoint, e.g. by
        prefixing.
      seed: seed of the client split.
      fractions: train/val/test fractions (6:2:2).
      overlap: what happens to users with data in both domains:
        "target" (default): the user is a T-client (the paper counts "clients with target domain
          data" as the T population and alpha = the proportion of such devices) and keeps all its
          examples, each tagged with its own domain, so S u T schemes use its S examples too
          (weighted by Eq. 3 with pi = S) while T-only stages select its T examples.
        "target_examples": the user is a T-client and its S examples are dropped, so the T
          population holds T data only.
        "drop": such users are removed.
      In every mode each user is in exactly one population, so the S and T populations are
      disjoint and mechanisms run on each separately compose in parallel (PT, the unigrams). A
      user is never split into two clients: that would make one user two DP units (doubling eps).
    Empty clients are dropped. The split is stratified: S- and T-clients are split 6:2:2
    separately (with seeds derived from ``seed``), so alpha is preserved across splits.
    """
    if overlap not in _OVERLAP_MODES:
        raise ValueError(f"overlap must be one of {_OVERLAP_MODES}, got {overlap!r}")
    kinds = set()
    clients: dict[Hashable, dict] = {}
    population: dict[Hashable, int] = {}
    both = set(source) & set(target)
    for cid in sorted(set(source) | set(target), key=repr):
        if cid in both and overlap == "drop":
            continue
        parts, doms = [], []
        for dom, data in ((SOURCE, source), (TARGET, target)):
            if cid not in data:
                continue
            if dom == SOURCE and cid in both and overlap == "target_examples":
                continue
            kind, ex = _as_examples(data[cid])
            if len(ex) == 0:
                continue
            kinds.add(kind)
            parts.append(ex)
            doms.append(np.full(len(ex), dom, np.int32))
        if not parts:
            continue
        if len(kinds) > 1:
            raise ValueError("source and target must both be strings or both token arrays")
        kind = next(iter(kinds))
        if kind == "tokens":
            if len({p.shape[1] for p in parts}) > 1:
                raise ValueError(f"client {cid!r}: token rows of different lengths")
            examples = np.concatenate(parts, axis=0)
        else:
            examples = [t for p in parts for t in p]
        dom = np.concatenate(doms)
        clients[cid] = {kind: examples, "domain": dom}
        population[cid] = TARGET if np.any(dom == TARGET) else SOURCE
    if not clients:
        raise ValueError("no client has any example")
    kind = next(iter(kinds))
    splits: dict[str, dict] = {"train": {}, "val": {}, "test": {}}
    for pop in (SOURCE, TARGET):
        ids = [c for c in clients if population[c] == pop]
        parts = split_clients(ids, seed=seed * 2 + pop, fractions=fractions)
        for name, part in zip(("train", "val", "test"), parts):
            for c in part:
                splits[name][c] = clients[c]
    alpha = _alpha(splits["train"], population)
    made = {name: _make_split(kind, d, name) for name, d in splits.items()}
    if kind == "tokens":  # FederatedDataset keys are strings
        population = {str(c): p for c, p in population.items()}
    return DomainDataset(train=made["train"], val=made["val"], test=made["test"],
                         population=population, alpha=alpha, overlap=overlap)


KOGA_SEQ_LEN = 10  # App. A: sentences are cut into sequences of length 10
KOGA_MAX_TOKENS_PER_CLIENT = 1600  # App. A: at most 1,600 tokens (words) per user


def chunk_sentence(ids: Sequence[int], seq_len: int = KOGA_SEQ_LEN) -> np.ndarray:
    """App. A: ``[BOS] + ids + [EOS]`` cut into sequences of ``seq_len`` targets: int32[r, L+1].

    Row j is ``s[j L : j L + L + 1]`` of s = [BOS] + ids + [EOS], right-padded with PAD, so rows
    overlap by one token: each row's inputs are ``row[:-1]`` and its targets ``row[1:]``, and
    every token after BOS is a target in exactly one row (a continuation row starts with the
    previous row's last target as context). r = ceil((len(ids) + 1) / L).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    seq = np.asarray([BOS_ID, *ids, EOS_ID], np.int32)
    n_rows = -(-(len(seq) - 1) // seq_len)
    out = np.full((n_rows, seq_len + 1), PAD_ID, np.int32)
    for j in range(n_rows):
        piece = seq[j * seq_len: j * seq_len + seq_len + 1]
        out[j, : len(piece)] = piece
    return out


def encode_domain_dataset(
    ds: DomainDataset,
    tokenizer,
    *,
    seq_len: int = KOGA_SEQ_LEN,
    max_tokens_per_client: int | None = KOGA_MAX_TOKENS_PER_CLIENT,
    chunk: bool = True,
) -> DomainDataset:
    """Tokenize a string `DomainDataset` as in App. A; per-example domain ids follow the rows.

    ``tokenizer.encode(list[str]) -> list[list[int]]`` (the `fedpriv.data.tokenizers` API, e.g.
    ``WordTokenizer.fit(ds.texts("train", TARGET), k=10_000)``: the top-10K words of the target
    domain's training data, App. A — a non-private release, see ``DomainDataset.texts``; or the
    top-k words of public text). Per client: at most ``max_tokens_per_client`` word ids are
    kept (target-domain texts first, so the scarce domain survives the cap; the text crossing the
    limit is truncated), then each text becomes rows of `chunk_sentence` (``chunk=True``, App. A),
    or one ``[BOS] + ids + [EOS]`` row truncated to ``seq_len + 1`` (``chunk=False``, TFF style,
    `fedpriv.data.federated.encode_examples`). Texts that encode to no id are dropped, then
    clients left with none; alpha is recomputed.
    """
    if max_tokens_per_client is not None and max_tokens_per_client < 1:
        raise ValueError("max_tokens_per_client must be >= 1 or None")
    out = {}
    population = {}
    for name in ("train", "val", "test"):
        clients = {}
        for cid, ex in ds.split(name).items():
            if "texts" not in ex:
                raise ValueError("encode_domain_dataset needs a dataset assembled from strings")
            ids = tokenizer.encode(list(ex["texts"]))
            dom = np.asarray(ex["domain"], np.int32)
            kept: dict[int, list[int]] = {}
            budget = math.inf if max_tokens_per_client is None else max_tokens_per_client
            for i in sorted(range(len(ids)), key=lambda i: (dom[i] != TARGET, i)):
                if budget <= 0:
                    break
                if len(ids[i]) == 0:
                    continue
                kept[i] = list(ids[i])[: int(min(budget, len(ids[i])))]
                budget -= len(kept[i])
            if not kept:
                continue
            order = sorted(kept)
            if chunk:
                rows = [chunk_sentence(kept[i], seq_len) for i in order]
                tokens = np.concatenate(rows)
                domain = np.concatenate([np.full(len(r), dom[i], np.int32)
                                         for r, i in zip(rows, order)])
            else:
                tokens = encode_examples([kept[i] for i in order], seq_len)
                domain = dom[order]
            clients[cid] = {"tokens": tokens, "domain": domain}
            population[str(cid)] = ds.population[cid]
        out[name] = FederatedDataset.from_clients(
            clients, vocab_size=getattr(tokenizer, "vocab_size", None), name=name,
            info={"seq_len": seq_len, "max_tokens_per_client": max_tokens_per_client,
                  "chunked": chunk}) if clients else {}
    return DomainDataset(train=out["train"], val=out["val"], test=out["test"],
                         population=population, alpha=_alpha(out["train"], population),
                         overlap=ds.overlap)


def select_clients(clients: Mapping[Hashable, Mapping[str, Any]],
                   population: Mapping[Hashable, int],
                   populations: Sequence[int],
                   example_domains: Sequence[int]) -> Mapping[Hashable, dict[str, Any]]:
    """Clients of the given populations, each keeping only examples of ``example_domains``.

    Every per-example field (array or list with the leading length of 'domain') is filtered;
    clients left with no example are dropped. E.g. a T-only stage: ``populations=(TARGET,),
    example_domains=(TARGET,)``; S u T: ``(SOURCE, TARGET), (SOURCE, TARGET)``. A
    FederatedDataset gives a FederatedDataset back.
    """
    out = {}
    for cid, ex in clients.items():
        if population[cid] not in populations:
            continue
        dom = np.asarray(ex["domain"])
        keep = np.isin(dom, np.asarray(example_domains))
        if not keep.any():
            continue
        n = len(dom)
        new = {}
        for key, val in ex.items():
            if isinstance(val, np.ndarray) and val.shape[:1] == (n,):
                new[key] = val[keep]
            elif isinstance(val, list) and len(val) == n:
                new[key] = [v for v, k in zip(val, keep) if k]
            else:
                new[key] = val
        out[cid] = new
    return _like(clients, out)


# ---------------------------------------------------------------------------------------------
# 4. Training schemes of Table 1 (Sec. 3.2, Sec. 4.2)
# ---------------------------------------------------------------------------------------------

TOTAL_BUDGET = (2.0, 1e-6)  # (eps, delta) per user for a whole scheme (Sec. 4.2)
UNIGRAM_BUDGET = (0.8, 0.0)  # (eps0, delta0) for the unigram release of IW and IWPT
IW_TRAINING_BUDGET = (1.2, 1e-6)  # (eps - eps0, delta - delta0) for IW / IWPT training

_POP_LABEL = {SOURCE: "S", TARGET: "T"}


@dataclasses.dataclass(frozen=True)
class Stage:
    """One DP-FL training stage of a scheme.

    populations: which clients are sampled (SOURCE and/or TARGET population).
    example_domains: which of their examples train (by per-example domain id).
    cohort: "C" or "alpha*C" (T-only and finetuning stages use alpha*C so their latency matches
      the C-cohort stages on the alpha-times-larger population, Sec. 3.2 PT).
    weighted: multiply per-example losses by Eq. 3 weights.
    rounds_fraction: this stage's share of the scheme's server rounds (PT: 1000 + 1000 of 2000).
    budget: (eps, delta) the stage's training spends on each user of its populations.
    """

    populations: tuple[int, ...]
    example_domains: tuple[int, ...]
    cohort: str
    weighted: bool
    rounds_fraction: float
    budget: tuple[float, float]

    def __post_init__(self):
        if self.cohort not in ("C", "alpha*C"):
            raise ValueError(f"cohort must be 'C' or 'alpha*C', got {self.cohort!r}")

    def cohort_size(self, C: int, alpha: float) -> int:
        """C, or max(1, round(alpha * C)) for an alpha*C stage (paper: 5000 / 500; 400 / 40)."""
        C = _check_count(C, "C")
        return C if self.cohort == "C" else max(1, round(_check_alpha(alpha) * C))

    @property
    def population_labels(self) -> tuple[str, ...]:
        return tuple(_POP_LABEL[p] for p in self.populations)

    def clients(self, ds: DomainDataset, split: str = "train") -> Mapping:
        """The stage's clients of ``ds`` with only its example domains (`select_clients`)."""
        return ds.clients(split, self.populations, self.example_domains)


@dataclasses.dataclass(frozen=True)
class PlannedSpend:
    """One ledger entry a scheme makes: (eps, delta) charged to each user of ``populations``."""

    name: str
    epsilon: float
    delta: float
    populations: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TrainingScheme:
    """A row of Koga et al. Table 1.

    model: "lstm" | "dsdsr" | "demix" (DSDSR: domain-shared + domain-specific representations;
      DEMix: domain-expert feed-forward layers; both get the per-example 'domain' ids).
    unigram_budget: (eps0, delta0) of the private unigrams (released on S and on T separately,
      each costing eps0 to its own users by parallel composition), or None if unused.
    """

    name: str
    model: str
    stages: tuple[Stage, ...]
    unigram_budget: tuple[float, float] | None = None

    def __post_init__(self):
        if self.model not in ("lstm", "dsdsr", "demix"):
            raise ValueError(f"model must be lstm, dsdsr or demix, got {self.model!r}")
        if not math.isclose(sum(s.rounds_fraction for s in self.stages), 1.0):
            raise ValueError("stage rounds fractions must sum to 1")

    @property
    def weighted(self) -> bool:
        return any(s.weighted for s in self.stages)

    def stage_rounds(self, total_rounds: int) -> tuple[int, ...]:
        """Rounds per stage (the paper: 2000 total; PT/IWPT 1000 + 1000); sums to total."""
        total_rounds = _check_count(total_rounds, "total_rounds")
        rounds = [round(s.rounds_fraction * total_rounds) for s in self.stages[:-1]]
        return tuple(rounds + [total_rounds - sum(rounds)])

    def privacy_plan(self, labels: Mapping[int, str] | None = None) -> tuple[PlannedSpend, ...]:
        """The ledger entries of the scheme in order; ``labels`` maps SOURCE/TARGET to ledger
        population labels (default "S"/"T")."""
        labels = dict(_POP_LABEL if labels is None else labels)
        plan = []
        if self.unigram_budget is not None:
            for pop in (SOURCE, TARGET):
                plan.append(PlannedSpend(f"{self.name}/unigrams[{labels[pop]}]",
                                         *self.unigram_budget, (labels[pop],)))
        for i, s in enumerate(self.stages):
            plan.append(PlannedSpend(f"{self.name}/stage{i}", *s.budget,
                                     tuple(labels[p] for p in s.populations)))
        return tuple(plan)

    def per_population_budget(self) -> dict[str, tuple[float, float]]:
        """Total (eps, delta) per user of each population by basic sequential composition within
        a population (spends on disjoint populations compose in parallel)."""
        tot: dict[str, list[float]] = {}
        for sp in self.privacy_plan():
            for pop in sp.populations:
                e = tot.setdefault(pop, [0.0, 0.0])
                e[0] += sp.epsilon
                e[1] += sp.delta
        return {k: (v[0], v[1]) for k, v in tot.items()}


def _schemes() -> tuple[TrainingScheme, ...]:
    S, T = SOURCE, TARGET
    full, iw = TOTAL_BUDGET, IW_TRAINING_BUDGET
    union = Stage((S, T), (S, T), "C", False, 1.0, full)
    return (
        TrainingScheme("T w. alpha*C", "lstm", (Stage((T,), (T,), "alpha*C", False, 1.0, full),)),
        TrainingScheme("T w. C", "lstm", (Stage((T,), (T,), "C", False, 1.0, full),)),
        TrainingScheme("S u T", "lstm", (union,)),
        TrainingScheme("DSDSR", "dsdsr", (union,)),
        TrainingScheme("DEMix", "demix", (union,)),
        TrainingScheme("IW", "lstm", (Stage((S, T), (S, T), "C", True, 1.0, iw),),
                       UNIGRAM_BUDGET),
        TrainingScheme("PT", "lstm", (Stage((S,), (S,), "C", False, 0.5, full),
                                      Stage((T,), (T,), "alpha*C", False, 0.5, full))),
        TrainingScheme("IWPT", "lstm", (Stage((S,), (S,), "C", True, 0.5, iw),
                                        Stage((T,), (T,), "alpha*C", False, 0.5, iw)),
                       UNIGRAM_BUDGET),
    )


TRAINING_SCHEMES: tuple[TrainingScheme, ...] = _schemes()
SCHEMES_BY_NAME: dict[str, TrainingScheme] = {s.name: s for s in TRAINING_SCHEMES}


def schemes_markdown(schemes: Sequence[TrainingScheme] = TRAINING_SCHEMES, *,
                     noise_cohort: int = 5000, train_cohort: int = 400, alpha: float = 0.1,
                     rounds: int = 2000) -> str:
    """Table 1's schemes as a Markdown table: per stage the population/examples, cohort sizes
    (noise-calibration / actual training, Sec. 4.2: 5000 / 400), rounds, weighting, and each
    scheme's (eps, delta) per population."""
    dom = {SOURCE: "S", TARGET: "T"}
    lines = ["| scheme | model | stages: clients[examples] cohort (noise/train) x rounds | "
             "unigrams (eps0, delta0) | (eps, delta) per population |",
             "|---|---|---|---|---|"]
    for s in schemes:
        stages = []
        for st, r in zip(s.stages, s.stage_rounds(rounds)):
            pops = "+".join(dom[p] for p in st.populations)
            exs = "+".join(dom[d] for d in st.example_domains)
            stages.append(f"{pops}[{exs}] {st.cohort_size(noise_cohort, alpha)}/"
                          f"{st.cohort_size(train_cohort, alpha)} x {r}"
                          f"{' weighted' if st.weighted else ''} @ {st.budget}")
        budget = ", ".join(f"{k}: ({e:g}, {d:g})" for k, (e, d) in
                           sorted(s.per_population_budget().items()))
        lines.append(f"| {s.name} | {s.model} | {'; then '.join(stages)} | "
                     f"{s.unigram_budget or '-'} | {budget} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# 5. Latency model (Prop. 3.1, Eq. 1, App. B)
# ---------------------------------------------------------------------------------------------


def _check_count(v: Any, name: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an integer count, got {v!r}")
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer count, got {v!r} "
                        f"({type(v).__name__})") from None
    if v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return v


def _check_latency_args(N, C, p, q, lam=None) -> tuple[int, int, float, float]:
    N = _check_count(N, "population size N")
    C = _check_count(C, "cohort size C")
    if C > N:
        raise ValueError(f"cohort size C={C} exceeds the population size N={N}")
    p, q = float(p), float(q)
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"availability ratio p must be in [0, 1], got {p!r}")
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sampling probability q must be in (0, 1], got {q!r}")
    if lam is not None:
        _check_lam(lam)
    return N, C, p, q


def _check_lam(lam) -> float:
    lam = float(lam)
    if not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"availability rate lambda must be finite and > 0, got {lam!r}")
    return lam


def latency_counts(N: int, C: int, p: float, q: float) -> tuple[int, int]:
    """(m, k) of Prop. 3.1: m = N - Np unavailable devices, k = C - Npq devices still needed.

    Device counts are integers: m = N - round(N p) and k = C - round(N p q) (round half to even;
    identical to the paper when Np and Npq are integers). k <= 0 means a full cohort is already
    available.
    """
    N, C, p, q = _check_latency_args(N, C, p, q)
    return N - round(N * p), C - round(N * p * q)


_ASYMPTOTIC_FROM = 64


def _harmonic_diff(m: int, b: int) -> float:
    """H_m - H_b = sum_{x=b+1}^{m} 1/x for integers m >= b >= 0, without cancellation.

    Short ranges: compensated direct sum. Long ranges with b >= 64: the asymptotic series of
    psi(x+1) = ln x + 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + ..., differenced term by term
    in closed form (ln(m/b) = log1p(k/b); 1/m^j - 1/b^j from k = m - b), error < 1e-17 relative.
    """
    if m - b <= 4096:
        return math.fsum(1.0 / x for x in range(b + 1, m + 1))
    if b < _ASYMPTOTIC_FROM:
        return (math.fsum(1.0 / x for x in range(b + 1, _ASYMPTOTIC_FROM + 1))
                + _harmonic_diff(m, _ASYMPTOTIC_FROM))
    k = m - b
    # 1/m^j - 1/b^j written with k = m - b, so no two nearly equal numbers are subtracted:
    d1 = -k / (m * b)  # 1/m - 1/b
    inv_m, inv_b = 1.0 / m, 1.0 / b
    d2 = d1 * (inv_m + inv_b)  # 1/m^2 - 1/b^2
    d4 = d2 * (inv_m**2 + inv_b**2)  # 1/m^4 - 1/b^4
    d6 = d2 * (inv_m**4 + inv_m**2 * inv_b**2 + inv_b**4)  # 1/m^6 - 1/b^6
    return math.log1p(k / b) + d1 / 2 - d2 / 12 + d4 / 120 - d6 / 252


def expected_kth_arrival(m: int, k: int, lam: float) -> float:
    """E[U_k] = (1/lambda) sum_{x=m-k+1}^{m} 1/x: mean time of the k-th of m i.i.d. Exp(lambda)
    arrivals (App. B). 0 for k <= 0; inf for k > m (the cohort can never fill)."""
    lam = _check_lam(lam)
    m, k = operator.index(m), operator.index(k)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if k <= 0:
        return 0.0
    if k > m:
        return math.inf
    return _harmonic_diff(m, m - k) / lam


def expected_latency(N: int, C: int, p: float, q: float, lam: float) -> float:
    """Exact E[U_k] of Prop. 3.1 for population N, cohort C, availability p, sampling q, rate
    lambda (m, k from `latency_counts`). 0 if k <= 0, inf if k > m."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return expected_kth_arrival(m, k, lam)


def latency_lower_bound(N: int, C: int, p: float, q: float, lam: float) -> float:
    """Eq. 1 lower bound (1/lambda)(C - Npq)/(N(1 - p) + 1) = k / (lambda (m + 1)), with the
    integer (m, k) of `latency_counts`; 0 when k <= 0. Holds for every valid argument."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return max(k, 0) / (float(lam) * (m + 1))


def latency_upper_bound(N: int, C: int, lam: float) -> float:
    """Eq. 1 upper bound C / (lambda (N - C)) (inf for C = N).

    Valid when the server oversamples, q >= C/N (the last step of App. B), and k <= m; otherwise
    use `latency_upper_bound_tight`.
    """
    N, C, _, _ = _check_latency_args(N, C, 0.0, 1.0, lam)
    return math.inf if C == N else C / (float(lam) * (N - C))


def latency_upper_bound_tight(N: int, C: int, p: float, q: float, lam: float) -> float:
    """The intermediate bound of App. B, k / (lambda (m - k)) (= ln(m/(m-k)) <= m/(m-k) - 1),
    valid without the q >= C/N assumption; 0 if k <= 0, inf if k >= m."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    if k <= 0:
        return 0.0
    return math.inf if k >= m else k / (float(lam) * (m - k))


class LatencyEstimate(NamedTuple):
    """Monte Carlo estimate of E[U_k]: sample mean, its standard error, number of trials."""

    mean: float
    stderr: float
    trials: int


def simulate_kth_arrival(m: int, k: int, lam: float, rng: np.random.Generator, trials: int,
                         *, method: str = "clocks", max_chunk_elements: int = 4_000_000
                         ) -> LatencyEstimate:
    """Monte Carlo of the time until k of m unavailable devices become available.

    method="clocks": each trial draws m i.i.d. Exp(lambda) availability times (float64[trials, m]
      in chunks of <= ``max_chunk_elements``) and takes the k-th smallest (np.partition): the
      literal model, independent of the memorylessness argument of App. B.
    method="order_statistic": the k-th smallest of m Exp(lambda) is -ln(V)/lambda with
      V ~ Beta(m - k + 1, k) (V = 1 - U_(k), U_(k) the k-th uniform order statistic); O(trials)
      work, for populations too large for clocks.
    k <= 0 gives (0, 0, trials); k > m gives (inf, 0, trials) (never filled).
    """
    lam = _check_lam(lam)
    trials = _check_count(trials, "trials")
    m, k = operator.index(m), operator.index(k)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if method not in ("clocks", "order_statistic"):
        raise ValueError(f"method must be 'clocks' or 'order_statistic', got {method!r}")
    if k <= 0:
        return LatencyEstimate(0.0, 0.0, trials)
    if k > m:
        return LatencyEstimate(math.inf, 0.0, trials)
    if method == "clocks":
        if m > 20_000_000:
            raise ValueError(f"m = {m:,} clocks per trial is too large for method='clocks'; "
                             "use method='order_statistic'")
        chunk = max(1, min(trials, max_chunk_elements // m))
        samples = []
        done = 0
        while done < trials:
            b = min(chunk, trials - done)
            t = rng.exponential(1.0 / lam, size=(b, m))
            samples.append(np.partition(t, k - 1, axis=1)[:, k - 1])
            done += b
        u = np.concatenate(samples)
    else:
        u = -np.log(rng.beta(m - k + 1, k, size=trials)) / lam
    se = float(u.std(ddof=1) / math.sqrt(trials)) if trials > 1 else math.nan
    return LatencyEstimate(float(u.mean()), se, trials)


def simulate_latency(N: int, C: int, p: float, q: float, lam: float, rng: np.random.Generator,
                     trials: int = 2000, *, method: str = "clocks") -> LatencyEstimate:
    """Monte Carlo estimate of Prop. 3.1's E[U_k] (see `simulate_kth_arrival`, `latency_counts`)."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return simulate_kth_arrival(m, k, lam, rng, trials, method=method)
