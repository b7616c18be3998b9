"""Private unigram frequencies per domain (Koga et al. 2023, Sec. 3.2 "Instance weighting", Sec. 4.2).

u_hat_pi per domain pi in {S, T}: each user contributes at most ``max_sequences`` = 5 sequences of
``max_tokens_per_sequence`` = 10 tokens, so under add/remove-one-user the count vector moves by at
most Delta = 5 * 10 = 50 in L1; the counts are released with the two-sided Geometric mechanism
(`fedpriv.dp.geometric`) at eps0 (the paper: (eps0, delta0) = (0.8, 0)), clipped at 0 and
normalised with an add-beta floor. The spend goes to the privacy ledger *before* any data is read,
under the entry name ``unigram_entry_name(population)`` (``"unigram_frequencies[S]"``, ...).

Which tokens are "x". The unigram model is a model of what the LM predicts: the *target positions*
``tokens[:, 1:]``, excluding PAD (padding, no loss) and BOS (an input marker that is never a
target, and whose frequency only encodes how sequences were cut). EOS and UNK are predicted by the
LM and are counted and scored like words. The same positions are counted for u_hat and scored for
p_hat (`fedpriv.expansion.weights`), so u_hat is a distribution over exactly the tokens that enter
the density; with the App. A rows of `chunk_sentence` every word of a sentence is a target in
exactly one row.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from dp_accounting import dp_event

from fedpriv.data.tokenizers import BOS_ID, PAD_ID
from fedpriv.dp import geometric, keys
from fedpriv.expansion.data import POPULATION_LABELS, SOURCE, TARGET

if TYPE_CHECKING:
    import jax

    from fedpriv.expansion.data import DomainDataset

__all__ = ["DEFAULT_IGNORE_IDS", "UNIGRAM_MAX_SEQUENCES", "UNIGRAM_MAX_TOKENS_PER_SEQUENCE",
           "UNIGRAM_ENTRY", "unigram_entry_name", "unigram_sensitivity", "bounded_user_counts",
           "unigram_counts", "private_unigram_frequencies", "normalise_counts",
           "domain_unigram_frequencies"]

DEFAULT_IGNORE_IDS = (PAD_ID, BOS_ID)

UNIGRAM_MAX_SEQUENCES = 5  # Sec. 4.2: "at most 5 sequences ..."
UNIGRAM_MAX_TOKENS_PER_SEQUENCE = 10  # "... with each of which have a fixed length of 10 tokens"

UNIGRAM_ENTRY = "unigram_frequencies"  # ledger entry name of a release: UNIGRAM_ENTRY[population]


def unigram_entry_name(population: str) -> str:
    """The ledger entry of the unigram release on ``population``: ``"unigram_frequencies[T]"``."""
    return f"{UNIGRAM_ENTRY}[{population}]"


class Ledger(Protocol):
    """The part of `fedpriv.dp.ledger.PrivacyLedger` used here."""

    def spend(self, name: str, event: dp_event.DpEvent, populations: tuple[str, ...]) -> Any: ...


def parse_bound(text: str) -> tuple[int, int]:
    """A per-user bound of the unigram release, ``"<sequences>x<tokens>"``: ``"5x10"`` ->
    ``(5, 10)`` (Delta = 50, the paper's). Raises ``ConfigError`` (one line) otherwise."""
    from fedpriv.data.errors import ConfigError
    try:
        s, t = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ConfigError(f"bound {text!r}: expected <sequences>x<tokens>, e.g. 5x10") from None
    if s < 1 or t < 1:
        raise ConfigError(f"bound {text!r}: both factors must be >= 1")
    return s, t


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
        their purpose (docs/design.md §3), so no other release ever draws the same noise.
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
        ledger.spend(name or unigram_entry_name(population), event,
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
    labels = dict(POPULATION_LABELS if labels is None else labels)
    out = []
    for pop in (SOURCE, TARGET):
        out.append(private_unigram_frequencies(
            _LazyClients(ds, split, pop), vocab_size, epsilon, rng, population=labels[pop],
            ledger=ledger, name=unigram_entry_name(labels[pop]), **kwargs))
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

