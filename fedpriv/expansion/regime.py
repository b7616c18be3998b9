"""When do the private unigrams of IW / IWPT carry signal? (Koga et al. 2023, Sec. 3.2, 4.2.)

IW weights S-examples by Eq. 3 with unigram densities estimated privately: u_hat_T is released
by `fedpriv.expansion.unigrams.private_unigram_frequencies` (two-sided Geometric noise at eps0
with sensitivity Delta = max_sequences x max_tokens_per_sequence). The weights can only help if
u_hat_T is closer to the true target unigrams u_T than the unweighted mixture is: the release's
total-variation distance TV(u_hat_T, u_T) must beat the "signal" TV(u_T, u_{S u T}) (u_{S u T}:
the pooled S u T counts, what S u T training fits without weights).

Back of envelope: every word gets noise of mean absolute value E|X| = 2a / (1 - a^2),
a = exp(-eps0 / Delta) (~ Delta / eps0 for small eps0 / Delta), while the bounded counts sum to
about N_T x Delta (users with >= Delta words), so TV ~ V E|X| / (2 N_T Delta) ~ V / (2 eps0 N_T):
it falls as 1 / N_T and 1 / eps0, grows with the vocabulary V, and does not depend on Delta
while users fill the bound (`predicted_noise_tv`). `measure_release` measures it with the
library's mechanism (every release charged to a `PrivacyLedger`); nothing here re-implements it.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from fedpriv.dp import keys
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.expansion.unigrams import (
    DEFAULT_IGNORE_IDS,
    normalise_counts,
    private_unigram_frequencies,
    unigram_counts,
    unigram_entry_name,
    unigram_sensitivity,
)

__all__ = ["tv_distance", "exact_frequencies", "full_counts", "noise_abs_mean",
           "predicted_noise_tv", "subsample_clients", "measure_release", "encoded_populations",
           "sweep_points", "measure_grid", "summarise_grid", "training_release", "scheme_table"]

_ALL = 10 ** 9  # no bound: every target position of every row


def tv_distance(p, q) -> float:
    """Total-variation distance 0.5 * sum |p - q| of two distributions of the same support."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"need two vectors of one shape, got {p.shape} and {q.shape}")
    for v in (p, q):
        if np.any(v < 0) or not math.isclose(v.sum(), 1.0, rel_tol=1e-6):
            raise ValueError("tv_distance needs probability vectors (non-negative, sum 1)")
    return float(0.5 * np.abs(p - q).sum())


def full_counts(clients: Mapping[Hashable, Any], vocab_size: int) -> np.ndarray:
    """All counted tokens (target positions, no PAD/BOS) of every user, unbounded (NOT private):
    `unigram_counts` without the 5 x 10 bound."""
    return unigram_counts(clients, vocab_size, np.random.default_rng(0), max_sequences=_ALL,
                          max_tokens_per_sequence=_ALL)


def exact_frequencies(counts: np.ndarray) -> np.ndarray:
    """counts / sum (no smoothing floor): the true unigram distribution of a population."""
    c = np.asarray(counts, np.float64)
    if c.sum() <= 0:
        raise ValueError("no counted token")
    return c / c.sum()


def noise_abs_mean(epsilon: float, sensitivity: float) -> float:
    """E|X| of the two-sided Geometric noise P(k) ~ a^|k|, a = exp(-eps / Delta): 2a / (1 - a^2)."""
    a = math.exp(-float(epsilon) / float(sensitivity))
    return 2 * a / (1 - a * a)


def predicted_noise_tv(vocab_size: int, epsilon: float, sensitivity: float,
                       counted_tokens: int) -> float:
    """Back-of-envelope TV(u_hat, noise-free bounded u): half the noise L1 (V E|X|) over the
    counted tokens, capped at 1. An overestimate where many words have count 0 (clipping at 0
    keeps only the positive half of their noise)."""
    return min(1.0, 0.5 * vocab_size * noise_abs_mean(epsilon, sensitivity)
               / max(1, counted_tokens))


def subsample_clients(clients: Mapping[Hashable, Any], n: int, seed: int) -> dict:
    """``n`` users drawn without replacement from ``clients`` (sorted ids, seeded): a smaller
    population of the same corpus. ``n`` larger than the population raises ValueError."""
    ids = sorted(clients, key=repr)
    if not 1 <= n <= len(ids):
        raise ValueError(f"cannot draw {n} users from a population of {len(ids)}")
    pick = np.sort(np.random.default_rng([seed, n]).choice(len(ids), size=n, replace=False))
    return {ids[i]: clients[ids[i]] for i in pick}


def measure_release(target: Mapping[Hashable, Any], source: Mapping[Hashable, Any],
                    vocab_size: int, epsilon: float, seed: int, *,
                    ledger: PrivacyLedger, max_sequences: int = 5,
                    max_tokens_per_sequence: int = 10, population: str = "T") -> dict:
    """Release u_hat_T of ``target`` with the library's mechanism and measure it.

    ``target`` / ``source``: client id -> int[n, L+1] token rows (or dicts with 'tokens') of the
    T and S users. The release is charged to ``ledger`` (population ``population``) before the
    data is read; the row choice and noise come from ``seed`` (`keys.numpy_generator`), so the
    noise-free counterpart below uses the very rows the release counted. Returns:
      tv_release: TV(u_hat_T, u_T), u_T = all of T's tokens (noise + the 5 x 10 bounding bias);
      tv_noise: TV(u_hat_T, same bounded counts without noise, same floor) (the noise alone);
      tv_signal: TV(u_T, u_{S u T}) (what IW must beat); carries_signal: tv_release < tv_signal;
      tv_predicted: `predicted_noise_tv`; n_users, counted_tokens, noise_abs_mean, ledger_epsilon
      (``ledger.spent()`` after the release: never below eps0).
    Evaluation only: tv_* and counted_tokens are exact statistics of the private users (like
    `fedpriv.expansion.unigram_diagnostics`), never fed back into training.
    """
    delta_l1 = unigram_sensitivity(max_sequences, max_tokens_per_sequence)
    u_hat = private_unigram_frequencies(
        target, vocab_size, epsilon, seed, population=population, ledger=ledger,
        name=unigram_entry_name(population), max_sequences=max_sequences,
        max_tokens_per_sequence=max_tokens_per_sequence)
    rows_rng = keys.numpy_generator(seed, "unigram", population, "rows")
    bounded = unigram_counts(target, vocab_size, rows_rng, max_sequences=max_sequences,
                             max_tokens_per_sequence=max_tokens_per_sequence)
    t_full = full_counts(target, vocab_size)
    u_t = exact_frequencies(t_full)
    u_union = exact_frequencies(t_full + full_counts(source, vocab_size))
    tv_release, tv_signal = tv_distance(u_hat, u_t), tv_distance(u_t, u_union)
    return {
        "n_users": len(target), "vocab_size": int(vocab_size), "epsilon0": float(epsilon),
        "sensitivity": delta_l1, "max_sequences": max_sequences,
        "max_tokens_per_sequence": max_tokens_per_sequence,
        "counted_tokens": int(bounded.sum()),
        "tv_release": tv_release,
        "tv_noise": tv_distance(u_hat, normalise_counts(bounded, zero_ids=DEFAULT_IGNORE_IDS)),
        "tv_signal": tv_signal, "carries_signal": bool(tv_release < tv_signal),
        "tv_predicted": predicted_noise_tv(vocab_size, epsilon, delta_l1, int(bounded.sum())),
        "noise_abs_mean": noise_abs_mean(epsilon, delta_l1),
        "ledger_epsilon": ledger.spent(),  # the pipeline's epsilon after this release
    }


# ---------------------------------------------------------------------------------------------
# The regime grid on real populations (experiments/iw_regime.py; configs/iw_regime.py)
# ---------------------------------------------------------------------------------------------

def encoded_populations(name: str, cfg, vocab_words: int,
                        pool_texts=None) -> tuple[dict, dict, int]:
    """(T clients, S clients, vocab size) of dataset ``name`` with EVERY active user (no alpha
    balancing, no split: the whole population releases), App. A encoding with the top
    ``vocab_words`` words of the public pool. ``cfg``: a configs/population_expansion.py config
    (min_words_per_client, max_chitchat_messages, seq_len, max_tokens_per_client, data_seed)."""
    from fedpriv.data import WordTokenizer, load_public_pool
    from fedpriv.expansion.data import SOURCE, TARGET, assemble_domain_dataset, encode_domain_dataset
    from fedpriv.expansion.datasets import load_domains
    source, target = load_domains(name, cfg)
    raw = assemble_domain_dataset(source, target, seed=cfg.data_seed, fractions=(1.0, 0.0, 0.0))
    if pool_texts is None:
        pool_texts = load_public_pool(progress=cfg.progress).texts
    tok = WordTokenizer.fit(pool_texts, k=vocab_words)
    ds = encode_domain_dataset(raw, tok, seq_len=cfg.seq_len,
                               max_tokens_per_client=cfg.max_tokens_per_client)

    def plain(pop):
        sub = ds.clients("train", (pop,), (pop,))
        return {c: sub[c]["tokens"] for c in sub.client_ids}
    return plain(TARGET), plain(SOURCE), tok.vocab_size


def sweep_points(cfg) -> list[dict]:
    """The (sweep, vocab, eps0, bound) points of an IW regime config (configs/iw_regime.py):
    eps0 at (base vocab, base bound), vocab at (base eps0, base bound), bound at (base vocab,
    base eps0); each point is measured at every N_T and seed."""
    pts = [dict(sweep="eps0", vocab=cfg.base_vocab, eps0=e, bound=cfg.base_bound)
           for e in cfg.epsilons0]
    pts += [dict(sweep="vocab", vocab=v, eps0=cfg.base_epsilon0, bound=cfg.base_bound)
            for v in cfg.vocabs]
    pts += [dict(sweep="bound", vocab=cfg.base_vocab, eps0=cfg.base_epsilon0, bound=b)
            for b in cfg.bounds]
    return pts


def _bound(text: str) -> tuple[int, int]:
    from fedpriv.expansion.unigrams import parse_bound
    return parse_bound(text)


def measure_grid(cfg, pe_cfg, budget: tuple[float, float], log=print) -> list[dict]:
    """One row per (sweep point, N_T, seed) of `sweep_points`, on ``cfg.regime_dataset``.
    Each release is a separate what-if measurement charged to its own
    ``PrivacyLedger(*budget)``: eps0 for the users it releases (composing the whole grid on the
    same users would cost the sum; the grid is a measurement study, not a deployment)."""
    from fedpriv.data import load_public_pool
    pool = load_public_pool(progress=pe_cfg.progress).texts
    encoded: dict[int, tuple] = {}
    done: dict[tuple, dict] = {}
    rows = []
    for pt in sweep_points(cfg):
        if pt["vocab"] not in encoded:
            encoded[pt["vocab"]] = encoded_populations(cfg.regime_dataset, pe_cfg, pt["vocab"],
                                                       pool)
        target, source, vocab_size = encoded[pt["vocab"]]
        ms, mt = _bound(pt["bound"])
        for n in cfg.n_targets:
            n_eff = len(target) if n == 0 or n > len(target) else n
            for seed in cfg.regime_seeds:
                key = (pt["vocab"], pt["eps0"], pt["bound"], n_eff, seed)
                if key not in done:  # the sweeps share their base point: measured once
                    done[key] = measure_release(
                        subsample_clients(target, n_eff, seed), source, vocab_size, pt["eps0"],
                        seed, ledger=PrivacyLedger(*budget), max_sequences=ms,
                        max_tokens_per_sequence=mt)
                rows.append({**pt, "n_target": n_eff, "seed": seed, **done[key]})
        log(f"[regime] {pt}: TV(release, true) at N_T = {rows[-1]['n_users']}: "
            f"{rows[-1]['tv_release']:.3f} vs signal {rows[-1]['tv_signal']:.3f}")
    return rows


def summarise_grid(rows: list[dict]) -> list[dict]:
    """Mean +- std over seeds of each (sweep, vocab, eps0, bound, N_T) point."""
    from fedpriv.report import mean_std
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["sweep"], r["vocab"], r["eps0"], r["bound"], r["n_target"]),
                          []).append(r)
    out = []
    for (sweep, vocab, eps0, bound, n), rs in groups.items():
        row = {"sweep": sweep, "vocab_words": vocab, "vocab_size": rs[0]["vocab_size"],
               "eps0": eps0, "bound": bound, "Delta": rs[0]["sensitivity"], "N_T": n,
               "seeds": len(rs)}
        for key in ("counted_tokens", "tv_release", "tv_noise", "tv_signal", "tv_predicted"):
            m, s, _ = mean_std([r[key] for r in rs])
            row[key], row[key + "_std"] = m, s
        row["carries_signal"] = f"{sum(r['carries_signal'] for r in rs)}/{len(rs)}"
        row["ledger_eps"] = max(r["ledger_epsilon"] for r in rs)
        out.append(row)
    return out


def training_release(ds, vocab_size: int, epsilon: float, seed: int,
                     budget: tuple[float, float]) -> dict:
    """`measure_release` on a prepared dataset's training split (T's users vs S's), as IW /
    IWPT release it: the negative case (Table 1's datasets) and the trained chat_target."""
    from fedpriv.expansion.data import SOURCE, TARGET

    def plain(pop):
        sub = ds.clients("train", (pop,), (pop,))
        return {c: sub[c]["tokens"] for c in sub.client_ids}
    return measure_release(plain(TARGET), plain(SOURCE), vocab_size, epsilon, seed,
                           ledger=PrivacyLedger(*budget))


def scheme_table(runs: list[dict], schemes, release: list[dict]) -> tuple[list[dict], dict]:
    """(rows, test PPLs by scheme) from `run_scheme` summaries: val/test perplexity on T, mean
    +- std over seeds (3 decimals), the ledger's epsilons, and for IW / IWPT the TV of the
    trained release (``release``: `training_release` rows, one per seed) and its signal."""
    from fedpriv.report import pm
    tv = pm([r["tv_release"] for r in release], digits=3)
    rows, test = [], {}
    for name in schemes:
        rs = [r for r in runs if r["scheme"] == name]
        if not rs:
            continue
        test[name] = [r["test_ppl"] for r in rs]
        eps = rs[0]["epsilon_by_population"]
        iw = name in ("IW", "IWPT")
        rows.append({"scheme": name, "val PPL on T": pm([r["val_ppl"] for r in rs], digits=3),
                     "test PPL on T": pm(test[name], digits=3),
                     "seeds": "/".join(str(r["seed"]) for r in rs),
                     "eps S (sim.)": eps.get("S"), "eps T (sim.)": eps.get("T"),
                     "unigram TV(release, true)": tv if iw else "",
                     "signal TV(u_T, u_SuT)": round(release[0]["tv_signal"], 4) if iw else ""})
    return rows, test
