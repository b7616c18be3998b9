"""Population facts of the packaged corpora: how many users each has and how a config's split
divides them -- what the privacy plans (``fedpriv.recipes.plans``) and the FreD table's declared
counts (``fedpriv.fred.embed``) account with, without loading any data.

The counts were measured once with the loaders' defaults (``fedpriv.data.load_*``); a corpus
missing here is an error, never a guess. The papers' own files (``corpus_path``,
``fedpriv.data.paper_corpora``) are counted in the file.
"""
from __future__ import annotations

from fedpriv.data.sampling import split_client_ids
from fedpriv.errors import ConfigError

__all__ = ["CORPUS_CLIENTS", "corpus_clients", "split_sizes", "lm_train_clients", "fred_train_clients"]

# Clients (users) of the packaged corpora with the loaders' defaults (`fedpriv.data.load_*`;
# chitchat's per-sender cap of 1000 messages keeps every sender).
CORPUS_CLIENTS = {"chitchat": 1315, "shakespeare": 1341, "simpsons": 1702}


def corpus_clients(corpus: str, path=None) -> int:
    """Users of ``corpus``: the packaged corpora's measured counts, or -- for the papers' own
    data (``corpus_path``, ``fedpriv.data.paper_corpora``) -- counted in the file, so the plan
    accounts the real population (e.g. StackOverflow's 342,477 training users)."""
    from fedpriv.data import paper_corpora
    if corpus in paper_corpora.PATH_LOADERS:
        if not path:
            raise ConfigError(f"corpus={corpus} needs corpus_path (the plan counts its users)")
        return paper_corpora.count_users(corpus, path)
    if corpus not in CORPUS_CLIENTS:
        raise ConfigError(f"no known client count for corpus {corpus!r}: add it to "
                          "fedpriv.data.populations.CORPUS_CLIENTS (a plan never guesses a population)")
    return CORPUS_CLIENTS[corpus]


def split_sizes(n: int, fractions) -> tuple[int, ...]:
    """Group sizes of ``split_client_ids`` on ``n`` clients (the runs' split; seed-independent)."""
    return tuple(len(g) for g in split_client_ids([f"{i:09d}" for i in range(n)], fractions, 0))


def lm_train_clients(cfg, total: int | None = None) -> int:
    """Training clients of an LM run (``recipes.lm.prepare_data`` / ``recipes.public.prepare``):
    ``max_clients`` of the corpus (or of ``total``), the first part of ``split``."""
    n = corpus_clients(cfg.corpus, getattr(cfg, "corpus_path", None)) if total is None else total
    if cfg.max_clients is not None and cfg.max_clients < n:
        n = cfg.max_clients
    return split_sizes(n, cfg.split)[0]


def fred_train_clients(cfg) -> int:
    """FL users of the FreD pipeline (``fedpriv.recipes.fred_pipeline.build_data``): the private
    fraction of the chitchat senders, at most ``lm.max_clients``, the training split."""
    private = split_sizes(corpus_clients("chitchat"), (cfg.private_fraction, 1 - cfg.private_fraction))[0]
    return lm_train_clients(cfg.lm, total=private)
