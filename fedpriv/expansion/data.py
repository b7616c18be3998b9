"""Domain-adaptation dataset assembly of Koga et al. 2023 (Sec. 4.1, 4.2, App. A).

The union of a source and a target federated dataset: per-example domain ids, per-client
population labels (users with T data are T-clients), alpha, a seeded stratified 6:2:2 client
split, and the App. A preprocessing (a word vocabulary — the paper's is T's training texts, known
in advance; the experiment's default is the public pool's, `fedpriv.expansion.datasets`;
[BOS] + words + [EOS] cut into sequences of 10 targets; at most 1,600 words per user).

Conventions. Token ids PAD = 0, UNK = 1, BOS = 2, EOS = 3 (`fedpriv.data.tokenizers`). A client's
LM examples are ``tokens: int32[n, L+1]``: position 0 is the input-only start (BOS for a sentence
start) and positions 1..L are the prediction targets. Domain ids: ``SOURCE = 0``, ``TARGET = 1``
(of examples, ``'domain': int32[n]``, and of clients, ``DomainDataset.population``). Host-side
NumPy throughout; the client split is seeded by an integer.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedpriv.data.federated import FederatedDataset, encode_examples
from fedpriv.data.tokenizers import BOS_ID, EOS_ID, PAD_ID

__all__ = ["SOURCE", "TARGET", "POPULATION_LABELS", "DomainDataset", "assemble_domain_dataset",
           "encode_domain_dataset", "chunk_sentence", "KOGA_SEQ_LEN", "KOGA_MAX_TOKENS_PER_CLIENT",
           "split_clients", "select_clients"]

SOURCE, TARGET = 0, 1  # domain ids of examples and population labels of clients
POPULATION_LABELS = {SOURCE: "S", TARGET: "T"}  # ledger population labels of SOURCE / TARGET


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


def _client_parts(cid, source, target, both, overlap: str, kinds: set):
    """User ``cid``'s non-empty examples per domain it keeps (``overlap``): ``(parts, domain id
    arrays)``; the kinds seen ("texts" / "tokens") are added to ``kinds``."""
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
    return parts, doms


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
        parts, doms = _client_parts(cid, source, target, both, overlap, kinds)
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

