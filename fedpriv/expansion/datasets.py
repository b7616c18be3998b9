"""The two domain-adaptation datasets of the Table 1 reproduction (Koga et al. 2023, Sec. 4.1, App. A).

Built from real user-keyed text (the paper's Reddit / Common Voice cannot be downloaded here):

* ``spoken_vs_typed`` (the paper's "CV & Reddits"): T = Simpsons speakers (transcribed speech,
  ``load_simpsons``), S = chitchat senders (typed chat, ``load_chitchat``).
* ``topics`` (the paper's "SubReddits"): one source, two disjoint topic groups: T = Shakespeare's
  First Folio comedies, S = its histories and tragedies; clients = (play, role) (LEAF).
* ``chat_target`` (not in the paper; the large-T variant of the IW regime study,
  ``experiments/iw_regime.py``): T = chitchat senders (typed chat, the largest user-keyed corpus
  here: 1,144 active senders), S = Simpsons speakers + Shakespeare roles (2,014 active users).
  The two corpora above give only 50-80 target training users at alpha = 0.1, too few for the
  private unigram release of IW/IWPT to carry signal; here T can have several hundred, at the
  price of a larger alpha (S is at most ~2K users, so alpha = 0.25 for |T| ~ 670).

The populations are disjoint (different users), so every user is in exactly one of S, T. The
population ratio is set to alpha = |T| / (|S| + |T|) by subsampling the larger side
(`balance_populations`) after dropping users with fewer than ``min_words_per_client`` words. App.
A preprocessing: vocabulary = top-k words (of the public pool by default; ``vocabulary=
"target_train"``: of T's training texts, as the paper — a non-private release the pipeline records
in the ledger, `PRIVATE_VOCABULARY`), [BOS] words [EOS] cut into sequences of 10, 1,600 words per
user (`encode_domain_dataset`); a stratified 6:2:2 client split (Sec. 4.2).

``cfg`` is a ``configs/population_expansion.py`` config (any object with its fields).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fedpriv.data import WordTokenizer, load_chitchat, load_public_pool, load_shakespeare, load_simpsons
from fedpriv.data.errors import ConfigError
from fedpriv.data.text import FederatedText
from fedpriv.expansion.data import (
    POPULATION_LABELS,
    SOURCE,
    TARGET,
    DomainDataset,
    assemble_domain_dataset,
    encode_domain_dataset,
)

__all__ = ["FOLIO_COMEDIES", "FOLIO_HISTORIES", "FOLIO_TRAGEDIES", "DATASET_INFO", "Prepared",
           "PRIVATE_VOCABULARY", "build_vocabulary", "balance_populations", "load_domains",
           "check_cohorts", "prepare_dataset"]

# First Folio (1623) genres. Pericles is not in the Folio and belongs to neither group.
FOLIO_COMEDIES = (
    "tempest", "two_gentlemen_of_verona", "merry_wives_of_windsor", "measure_for_measure",
    "comedy_of_errors", "much_ado_about_nothing", "loves_labours_lost", "midsummer_nights_dream",
    "merchant_of_venice", "as_you_like_it", "taming_of_the_shrew", "alls_well_that_ends_well",
    "twelfth_night", "winters_tale")
FOLIO_HISTORIES = (
    "john", "richard_ii", "henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1",
    "henry_vi_part_2", "henry_vi_part_3", "richard_iii", "henry_viii")
FOLIO_TRAGEDIES = (
    "troilus_and_cressida", "coriolanus", "tragedy_of_titus_andronicus", "romeo_and_juliet",
    "timon_of_athens", "julius_caesar", "macbeth", "hamlet", "lear", "othello",
    "antony_and_cleopatra", "cymbeline")

DATASET_INFO = {
    "spoken_vs_typed": {"paper": "CV&Reddits", "T": "Simpsons speakers (spoken, transcribed)",
                        "S": "chitchat senders (typed)"},
    "topics": {"paper": "SubReddits", "T": "Shakespeare comedies, clients = (play, role)",
               "S": "Shakespeare histories + tragedies, clients = (play, role)"},
    "chat_target": {"paper": "(large-T variant, not in the paper)",
                    "T": "chitchat senders (typed chat)",
                    "S": "Simpsons speakers + Shakespeare roles (spoken / dramatic)"},
}


@dataclasses.dataclass
class Prepared:
    """A tokenized domain-adaptation dataset and what the table reports about it."""

    name: str
    ds: DomainDataset     # FederatedDatasets with 'tokens' and 'domain'
    vocab_size: int
    val_tokens: np.ndarray       # the T-population val clients' T sequences, int32[n, L+1]
    test_tokens: np.ndarray
    stats: dict
    vocabulary_public: bool = True  # False: built from T's training text (a non-private release)


# the ledger entry of a vocabulary built from the target users' training text
PRIVATE_VOCABULARY = "vocabulary (top-k words of T's training text)"


def build_vocabulary(cfg, raw: DomainDataset) -> tuple[WordTokenizer, bool]:
    """The word vocabulary and whether it is public. ``cfg.vocabulary``: ``"public"`` — the
    top-``vocab_words`` words of the public pool (``load_public_pool``; no privacy cost);
    ``"target_train"`` — those of T's training texts (Koga et al. App. A, who assume it known in
    advance): a word used by one user reveals that user, so every ledger of the run records it
    as a non-private release (``PrivacyLedger.record_nonprivate``)."""
    if cfg.vocabulary == "public":
        return WordTokenizer.fit(load_public_pool(progress=cfg.progress).texts, k=cfg.vocab_words), True
    if cfg.vocabulary == "target_train":
        return WordTokenizer.fit(raw.texts("train", TARGET), k=cfg.vocab_words), False
    raise ValueError(f"vocabulary must be public or target_train, got {cfg.vocabulary!r}")


def _words(texts) -> int:
    return sum(len(t.split()) for t in texts)


def _active(text: FederatedText, min_words: int) -> dict[str, list[str]]:
    return {c: list(text[c]) for c in text.client_ids if _words(text[c]) >= min_words}


def balance_populations(source: dict, target: dict, alpha: float, seed: int
                        ) -> tuple[dict, dict, str]:
    """Subsample the side in excess so that |T| / (|S| + |T|) ~ alpha (seeded, sorted ids).

    The paper (Sec. 4.1, CV & Reddits) samples S clients so the total is 1/alpha times |T|;
    when S is too small for that, T is subsampled instead. Returns (source, target, which side
    was subsampled).
    """
    rng = np.random.default_rng(seed)
    n_s, n_t = len(source), len(target)
    sample = lambda d, k: _sample(d, k, rng)

    want_t = round(alpha / (1 - alpha) * n_s)
    if n_t > want_t:
        return source, sample(target, max(1, want_t)), "T"
    want_s = round((1 - alpha) / alpha * n_t)
    if n_s > want_s:
        return sample(source, want_s), target, "S"
    return source, target, "none"


def _sample(d: dict, k: int, rng: np.random.Generator) -> dict:
    """``k`` of ``d``'s entries, drawn without replacement over the sorted ids."""
    ids = sorted(d)
    keep = sorted(rng.choice(len(ids), size=k, replace=False))
    return {ids[i]: d[ids[i]] for i in keep}


def _capped(d: dict, k: int | None, seed: int) -> dict:
    return d if k is None or len(d) <= k else _sample(d, k, np.random.default_rng(seed))


def load_domains(name: str, cfg) -> tuple[dict, dict]:
    """(source, target): client id -> list of texts, ids prefixed so the populations are
    disjoint, users with fewer than ``cfg.min_words_per_client`` words dropped."""
    if name == "spoken_vs_typed":
        src = load_chitchat(max_examples_per_client=cfg.max_chitchat_messages, seed=cfg.data_seed,
                            progress=cfg.progress)
        tgt = load_simpsons(progress=cfg.progress)
        source = {f"chitchat/{c}": v for c, v in _active(src, cfg.min_words_per_client).items()}
        target = {f"simpsons/{c}": v for c, v in _active(tgt, cfg.min_words_per_client).items()}
    elif name == "topics":
        text = load_shakespeare(progress=cfg.progress)
        active = _active(text, cfg.min_words_per_client)
        play = lambda c: c.split("/", 1)[0]
        source = {c: v for c, v in active.items()
                  if play(c) in FOLIO_HISTORIES + FOLIO_TRAGEDIES}
        target = {c: v for c, v in active.items() if play(c) in FOLIO_COMEDIES}
    elif name == "chat_target":
        src = load_chitchat(max_examples_per_client=cfg.max_chitchat_messages, seed=cfg.data_seed,
                            progress=cfg.progress)
        target = {f"chitchat/{c}": v for c, v in _active(src, cfg.min_words_per_client).items()}
        source = {f"simpsons/{c}": v for c, v in
                  _active(load_simpsons(progress=cfg.progress), cfg.min_words_per_client).items()}
        source.update({f"shakespeare/{c}": v for c, v in _active(
            load_shakespeare(progress=cfg.progress), cfg.min_words_per_client).items()})
    else:
        raise ValueError(f"unknown dataset {name!r}")
    return source, target


def check_cohorts(ds: DomainDataset, cfg, schemes=None) -> None:
    """Refuse (`ConfigError`, one line) a trained cohort larger than the population it samples.

    Every stage of ``schemes`` (default ``cfg.training_schemes``) Poisson-samples its expected
    cohort (``cfg.train_cohort``, x alpha for alpha*C stages) from its training clients at rate
    q = cohort / N; q > 1 is impossible, and capping it at 1 would silently train a smaller
    cohort than the table claims. Run at data-prep time, before any training (the noise cohort
    ``cfg.noise_cohort`` is a simulated population scaled up by the same factor, so it may
    exceed N by design)."""
    schemes = getattr(cfg, "training_schemes", ()) if schemes is None else schemes
    for scheme in schemes:
        for i, stage in enumerate(scheme.stages):
            cohort = stage.cohort_size(cfg.train_cohort, ds.alpha)
            n = len(stage.clients(ds, "train"))
            if cohort > n:
                raise ConfigError(
                    f"scheme {scheme.name!r} stage {i}: cohort {cohort} ({stage.cohort}) exceeds "
                    f"its population of {n} training clients; lower train_cohort or use a "
                    f"larger population")


def prepare_dataset(name: str, cfg) -> Prepared:
    """Load, balance to alpha, split 6:2:2, build the T vocabulary, tokenize (App. A)."""
    source, target = load_domains(name, cfg)
    n_s0, n_t0 = len(source), len(target)
    source = _capped(source, cfg.max_source_clients, cfg.data_seed)
    target = _capped(target, cfg.max_target_clients, cfg.data_seed + 1)
    source, target, subsampled = balance_populations(source, target, cfg.alpha, cfg.data_seed)
    raw = assemble_domain_dataset(source, target, seed=cfg.data_seed,
                                         fractions=tuple(cfg.split))
    tok, vocab_public = build_vocabulary(cfg, raw)
    ds = encode_domain_dataset(raw, tok, seq_len=cfg.seq_len,
                                      max_tokens_per_client=cfg.max_tokens_per_client)

    def t_tokens(split):
        tok_ = ds.clients(split, (TARGET,), (TARGET,)).concat_examples()["tokens"]
        return tok_[: cfg.max_eval_examples] if cfg.max_eval_examples else tok_

    stats = {"dataset": name, "paper_dataset": DATASET_INFO[name]["paper"],
             "T": DATASET_INFO[name]["T"], "S": DATASET_INFO[name]["S"],
             "active_S_users": n_s0, "active_T_users": n_t0, "subsampled": subsampled,
             "alpha_train": ds.alpha, "vocab_size": tok.vocab_size,
             "vocabulary": ("public pool top-k words" if vocab_public else
                            "NON-PRIVATE: top-k words of T's training text")}
    for split in ("train", "val", "test"):
        for pop in (SOURCE, TARGET):
            sub = ds.clients(split, (pop,), (pop,))
            stats[f"{split}_{POPULATION_LABELS[pop]}_clients"] = len(sub)
            stats[f"{split}_{POPULATION_LABELS[pop]}_sequences"] = int(sub.concat_examples()["tokens"].shape[0])
    val, test = t_tokens("val"), t_tokens("test")
    stats["val_T_eval_sequences"], stats["test_T_eval_sequences"] = len(val), len(test)
    check_cohorts(ds, cfg)
    return Prepared(name, ds, tok.vocab_size, val, test, stats, vocab_public)


# ---------------------------------------------------------------------------------------------
# One scheme (a row of Table 1) on one dataset and seed
# ---------------------------------------------------------------------------------------------
