"""Token-level federated datasets (Wang et al. 2023, §2 "Cross-device Federated Learning").

A :class:`FederatedDataset` is a read-only mapping client id -> ``dict[str, np.ndarray]`` whose
arrays share a leading example axis. For language models the dict is::

    {'tokens': int32[n, L + 1]}     # BOS + ids + EOS, truncated / right-padded with PAD to L + 1

so inputs are ``tokens[:, :-1]`` and next-token targets ``tokens[:, 1:]`` (each ``[n, L]``).
Special ids: PAD = 0, UNK = 1, BOS = 2, EOS = 3. As in TFF's StackOverflow pipeline, a sentence
with ``>= L`` tokens keeps its first ``L`` and has no EOS.

The papers' caps are the defaults: at most 256 examples per client, sequence length L = 20,
batch size 16 (Wang et al. §2; Kairouz et al. 2021). Splits into train/validation/test are by
client with an explicit seed. Storage is one concatenated array per key plus client offsets, so
``dataset[cid]`` returns read-only views without copying. The FL engine builds padded
``[C, S, B, ...]`` cohorts from ``dataset[cid]``; :meth:`FederatedDataset.concat_examples`
gives all examples of some clients for central evaluation.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fedpriv.data.errors import EmptyClientError, EmptyCorpusError, VocabularyMismatchError
from fedpriv.data.sampling import cap_examples, check_max_examples, split_client_ids
from fedpriv.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, check_ids

__all__ = ["FederatedDataset", "encode_examples", "DEFAULT_SEQ_LEN",
           "DEFAULT_MAX_EXAMPLES_PER_CLIENT", "DEFAULT_BATCH_SIZE"]

DEFAULT_SEQ_LEN = 20
DEFAULT_MAX_EXAMPLES_PER_CLIENT = 256
DEFAULT_BATCH_SIZE = 16


def encode_examples(ids: Sequence[Sequence[int]], seq_len: int = DEFAULT_SEQ_LEN) -> np.ndarray:
    """Id lists -> int32[n, seq_len + 1]: ``[BOS] + ids + [EOS]`` cut to ``seq_len + 1`` and
    right-padded with PAD (a sequence of ``>= seq_len`` ids keeps ``seq_len`` of them, no EOS)."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    out = np.full((len(ids), seq_len + 1), PAD_ID, dtype=np.int32)
    out[:, 0] = BOS_ID
    for r, seq in enumerate(ids):
        seq = list(seq)[:seq_len] + [EOS_ID]
        seq = seq[:seq_len]
        out[r, 1:1 + len(seq)] = seq
    return out


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class FederatedDataset(Mapping[str, dict[str, np.ndarray]]):
    """Read-only mapping client id -> dict of NumPy arrays with a shared leading example axis.

    Args:
      client_ids: C client ids (their order is the stable ``client_ids`` order).
      arrays: dict key -> array of shape ``[N, ...]``, all clients' examples concatenated.
      offsets: int64[C + 1], client ``i`` owns rows ``offsets[i]:offsets[i+1]`` (non-decreasing,
        ``offsets[0] == 0``, ``offsets[-1] == N``). Clients with zero rows are dropped (recorded
        in ``dropped``); if none is left :class:`EmptyCorpusError` is raised.
      vocab_size: if given, ``arrays['tokens']`` is checked to lie in ``[0, vocab_size)``
        (:class:`VocabularyMismatchError` otherwise).
      batch_size: the local batch size the FL engine should use (paper: 16).
      dropped: client id -> reason, for clients removed earlier (e.g. by filtering).
      info: free-form provenance (tokenizer name, seq_len, truncation counts, ...).
    """

    def __init__(self, client_ids: Sequence[str], arrays: Mapping[str, np.ndarray],
                 offsets: Sequence[int] | np.ndarray, *, vocab_size: int | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, dropped: Mapping[str, str] | None = None,
                 info: Mapping[str, Any] | None = None, name: str = "federated"):
        if not arrays:
            raise ValueError("FederatedDataset needs at least one array")
        offsets = np.asarray(offsets, dtype=np.int64)
        ids = [str(c) for c in client_ids]
        if offsets.shape != (len(ids) + 1,):
            raise ValueError(f"offsets must have shape [{len(ids) + 1}], got {offsets.shape}")
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate client ids")
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        n = {v.shape[0] if v.ndim else -1 for v in arrays.values()}
        if len(n) != 1 or -1 in n:
            raise ValueError(f"arrays must share a leading example axis, got shapes "
                             f"{ {k: v.shape for k, v in arrays.items()} }")
        total = n.pop()
        if offsets[0] != 0 or offsets[-1] != total or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must be non-decreasing from 0 to {total}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._dropped = dict(dropped or {})
        counts = np.diff(offsets)
        keep = counts > 0
        for cid, k in zip(ids, keep):
            if not k:
                self._dropped.setdefault(cid, "no examples after filtering")
        if not keep.any():
            raise EmptyCorpusError(f"{name}: no client has any example "
                                   f"({len(self._dropped)} clients dropped)")
        if not keep.all():
            rows = np.concatenate([np.arange(offsets[i], offsets[i + 1])
                                   for i in np.flatnonzero(keep)])
            arrays = {k: v[rows] for k, v in arrays.items()}
            ids = [c for c, k in zip(ids, keep) if k]
            offsets = np.concatenate([[0], np.cumsum(counts[keep])])
        if vocab_size is not None and "tokens" in arrays:
            check_ids(arrays["tokens"], vocab_size, f"{name}['tokens']")
        self._ids = tuple(ids)
        self._index = {c: i for i, c in enumerate(ids)}
        self._arrays = {k: _readonly(v) for k, v in arrays.items()}
        self._offsets = _readonly(offsets)
        self.vocab_size = vocab_size
        self.batch_size = int(batch_size)
        self.info = dict(info or {})
        self.name = name

    # Construction --------------------------------------------------------------------------
    @classmethod
    def from_clients(cls, clients: Mapping[str, Mapping[str, np.ndarray]], **kwargs
                     ) -> FederatedDataset:
        """From a mapping client id -> dict of arrays (same keys, trailing shapes, dtypes).
        Clients are kept in the mapping's iteration order."""
        ids = list(clients)
        if not ids:
            raise EmptyCorpusError("FederatedDataset.from_clients: no clients")
        keys = list(clients[ids[0]])
        arrays: dict[str, np.ndarray] = {}
        for k in keys:
            parts = []
            for c in ids:
                if set(clients[c]) != set(keys):
                    raise ValueError(f"client {c!r} has keys {sorted(clients[c])}, expected "
                                     f"{sorted(keys)}")
                parts.append(np.asarray(clients[c][k]))
            arrays[k] = np.concatenate(parts, axis=0)
        counts = [len(np.asarray(clients[c][keys[0]])) for c in ids]
        return cls(ids, arrays, np.concatenate([[0], np.cumsum(counts)]), **kwargs)

    @classmethod
    def from_text(cls, text: Mapping[str, Sequence[str]], tokenizer, *,
                  seq_len: int = DEFAULT_SEQ_LEN,
                  max_examples_per_client: int | None = DEFAULT_MAX_EXAMPLES_PER_CLIENT,
                  batch_size: int = DEFAULT_BATCH_SIZE, seed: int | None = None,
                  name: str | None = None) -> FederatedDataset:
        """Tokenize federated text (a :class:`~fedpriv.data.text.FederatedText`, whose
        ``client_ids`` order is kept, or any mapping client id -> strings, taken in sorted id
        order) into ``{'tokens': int32[n_c, seq_len + 1]}`` per client.

        Each client keeps at most ``max_examples_per_client`` examples (its first ones, or a
        random subset drawn with ``np.random.default_rng(seed)`` if ``seed`` is given; ``None``
        = no cap). Examples that tokenize to no ids are dropped; clients left with none are
        dropped and recorded in ``dropped``. ``info`` records the tokenizer, ``seq_len``, and
        how many examples were truncated / dropped / capped.
        """
        rng = None if seed is None else np.random.default_rng(seed)
        name = name or getattr(text, "name", "federated")
        ids_out: list[str] = []
        parts: list[np.ndarray] = []
        dropped = dict(getattr(text, "dropped", {}) or {})
        n_trunc = n_empty = n_capped = 0
        n_tokens_untruncated = 0
        # A FederatedText has `client_ids` (duck-typed: fedpriv.data.text imports this module).
        client_ids = getattr(text, "client_ids", None)
        for cid in (sorted(text) if client_ids is None else client_ids):
            ex = list(text[cid])
            kept = cap_examples(ex, max_examples_per_client, rng)
            n_capped += len(ex) - len(kept)
            ex = kept
            enc = [s for s in tokenizer.encode(ex) if len(s) > 0]
            n_empty += len(ex) - len(enc)
            n_trunc += sum(len(s) + 1 > seq_len for s in enc)
            n_tokens_untruncated += sum(len(s) for s in enc)
            if not enc:
                dropped[cid] = "no examples left after tokenization"
                continue
            ids_out.append(cid)
            parts.append(encode_examples(enc, seq_len))
        if not parts:
            raise EmptyCorpusError(f"{name}: no client has an example after tokenization")
        counts = [p.shape[0] for p in parts]
        info = dict(tokenizer=getattr(tokenizer, "name", type(tokenizer).__name__),
                    seq_len=seq_len, max_examples_per_client=max_examples_per_client,
                    truncated_examples=n_trunc, empty_examples=n_empty, capped_examples=n_capped,
                    tokens_before_truncation=n_tokens_untruncated)
        return cls(ids_out, {"tokens": np.concatenate(parts)},
                   np.concatenate([[0], np.cumsum(counts)]), vocab_size=tokenizer.vocab_size,
                   batch_size=batch_size, dropped=dropped, info=info, name=name)

    # Mapping interface ---------------------------------------------------------------------
    def _slice(self, client_id: str) -> slice:
        try:
            i = self._index[client_id]
        except KeyError:
            if client_id in self._dropped:
                raise EmptyClientError(client_id, self._dropped[client_id]) from None
            raise KeyError(f"unknown client id {client_id!r}") from None
        return slice(int(self._offsets[i]), int(self._offsets[i + 1]))

    def __getitem__(self, client_id: str) -> dict[str, np.ndarray]:
        """Client -> dict of read-only arrays ``[n_c, ...]`` (views, no copy).

        Raises:
          EmptyClientError: the client exists but has no examples (it was dropped).
          KeyError: unknown client id.
        """
        s = self._slice(client_id)
        return {k: v[s] for k, v in self._arrays.items()}

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._index

    def __repr__(self) -> str:
        return (f"FederatedDataset({self.name!r}, clients={len(self)}, "
                f"examples={self.total_examples}, keys={sorted(self._arrays)})")

    # Sizes -----------------------------------------------------------------------------------
    @property
    def client_ids(self) -> tuple[str, ...]:
        """Client ids in stable order."""
        return self._ids

    @property
    def dropped(self) -> dict[str, str]:
        """Clients removed because they had no examples, with the reason."""
        return dict(self._dropped)

    @property
    def array_keys(self) -> tuple[str, ...]:
        """The array keys of every client's dict (e.g. ``('tokens',)``)."""
        return tuple(self._arrays)

    @property
    def seq_len(self) -> int | None:
        """L for ``tokens`` of shape ``[n, L + 1]`` (None without a 'tokens' array)."""
        t = self._arrays.get("tokens")
        return None if t is None or t.ndim != 2 else t.shape[1] - 1

    def num_examples(self, client_id: str) -> int:
        s = self._slice(client_id)
        return s.stop - s.start

    def examples_per_client(self) -> np.ndarray:
        """int64[C]: examples of each client in ``client_ids`` order."""
        return np.diff(self._offsets)

    def num_batches(self, client_id: str, batch_size: int | None = None) -> int:
        """ceil(n_c / batch_size) local steps for one epoch (default ``self.batch_size``)."""
        return math.ceil(self.num_examples(client_id) / (batch_size or self.batch_size))

    @property
    def total_examples(self) -> int:
        return int(self._offsets[-1])

    @property
    def total_tokens(self) -> int:
        """Number of real (non-special) tokens in ``tokens``: not PAD, BOS or EOS. UNK counts."""
        t = self._arrays.get("tokens")
        if t is None:
            return 0
        return int(np.count_nonzero((t != PAD_ID) & (t != BOS_ID) & (t != EOS_ID)))

    def stats(self) -> dict[str, Any]:
        """Clients, examples, tokens (non-special; also with BOS/EOS and UNK count), and the
        quantiles (min, 10%, 50%, 90%, max) and mean of examples per client."""
        epc = self.examples_per_client()
        q = np.quantile(epc, [0.0, 0.1, 0.5, 0.9, 1.0])
        out: dict[str, Any] = dict(
            clients=len(self), examples=self.total_examples, tokens=self.total_tokens,
            examples_per_client=dict(min=int(q[0]), p10=float(q[1]), median=float(q[2]),
                                     p90=float(q[3]), max=int(q[4]), mean=float(epc.mean())),
            dropped_clients=len(self._dropped))
        t = self._arrays.get("tokens")
        if t is not None:
            out["tokens_with_bos_eos"] = int(np.count_nonzero(t != PAD_ID))
            out["unk_tokens"] = int(np.count_nonzero(t == 1))
            out["seq_len"] = self.seq_len
        out.update({k: v for k, v in self.info.items() if k.endswith("examples")})
        return out

    # Derived datasets --------------------------------------------------------------------------
    def subset(self, client_ids: Iterable[str], name: str | None = None) -> FederatedDataset:
        """The dataset restricted to ``client_ids`` (in that order; each must have examples)."""
        ids = list(client_ids)
        slices = [self._slice(c) for c in ids]
        if not ids:
            raise EmptyCorpusError(f"{self.name}: subset of no clients")
        rows = np.concatenate([np.arange(s.start, s.stop) for s in slices])
        counts = [s.stop - s.start for s in slices]
        return FederatedDataset(ids, {k: v[rows] for k, v in self._arrays.items()},
                                np.concatenate([[0], np.cumsum(counts)]),
                                vocab_size=self.vocab_size, batch_size=self.batch_size,
                                info=self.info, name=name or self.name)

    def split_by_client(self, fractions: Sequence[float] = (0.8, 0.1, 0.1), *, seed: int
                        ) -> tuple[FederatedDataset, ...]:
        """Disjoint datasets partitioning the clients (train/validation/test by default), drawn
        with ``np.random.default_rng(seed)``; see :func:`fedpriv.data.text.split_client_ids`."""
        groups = split_client_ids(self._ids, fractions, seed)
        return tuple(self.subset(sorted(g, key=self._index.__getitem__), name=f"{self.name}[{i}]")
                     for i, g in enumerate(groups))

    def cap(self, max_examples_per_client: int, seed: int | None = None) -> FederatedDataset:
        """At most ``max_examples_per_client`` examples per client (first ones, or a random
        subset drawn with ``np.random.default_rng(seed)``)."""
        check_max_examples(max_examples_per_client)
        rng = None if seed is None else np.random.default_rng(seed)
        rows, counts = [], []
        for i in range(len(self._ids)):
            lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
            n = hi - lo
            if n > max_examples_per_client:
                sel = (np.arange(max_examples_per_client) if rng is None else
                       np.sort(rng.choice(n, max_examples_per_client, replace=False)))
                rows.append(lo + sel)
            else:
                rows.append(np.arange(lo, hi))
            counts.append(len(rows[-1]))
        r = np.concatenate(rows)
        return FederatedDataset(self._ids, {k: v[r] for k, v in self._arrays.items()},
                                np.concatenate([[0], np.cumsum(counts)]),
                                vocab_size=self.vocab_size, batch_size=self.batch_size,
                                dropped=self._dropped, info=self.info, name=self.name)

    def concat_examples(self, client_ids: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """All examples of ``client_ids`` (default: every client) as one dict of arrays
        ``[sum_c n_c, ...]`` (a copy), for central evaluation."""
        if client_ids is None:
            return {k: np.array(v) for k, v in self._arrays.items()}
        slices = [self._slice(c) for c in client_ids]
        if not slices:
            return {k: v[:0].copy() for k, v in self._arrays.items()}
        rows = np.concatenate([np.arange(s.start, s.stop) for s in slices])
        return {k: v[rows] for k, v in self._arrays.items()}

    def check_vocab(self, vocab_size: int) -> None:
        """Raise :class:`VocabularyMismatchError` if a token id is ``>= vocab_size``."""
        if "tokens" not in self._arrays:
            raise VocabularyMismatchError(f"{self.name} has no 'tokens' array")
        check_ids(self._arrays["tokens"], vocab_size, f"{self.name}['tokens']")

    # Persistence ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write to an ``.npz`` file (arrays, offsets, client ids, metadata as JSON)."""
        p = pathlib.Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(name=self.name, vocab_size=self.vocab_size, batch_size=self.batch_size,
                    dropped=self._dropped, info=self.info, keys=list(self._arrays))
        with open(p, "wb") as f:
            np.savez(f, __offsets__=np.asarray(self._offsets),
                     __client_ids__=np.asarray(self._ids, dtype=np.str_),
                     __meta__=np.asarray(json.dumps(meta, default=str)),
                     **{f"a_{k}": np.asarray(v) for k, v in self._arrays.items()})
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> FederatedDataset:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            arrays = {k: z[f"a_{k}"] for k in meta["keys"]}
            return cls(list(z["__client_ids__"]), arrays, z["__offsets__"],
                       vocab_size=meta["vocab_size"], batch_size=meta["batch_size"],
                       dropped=meta["dropped"], info=meta["info"], name=meta["name"])
