"""Tokenizers for on-device LMs and the word -> token accuracy conversion (Wang et al. 2023, §3.1).

Prior private-FL work tokenizes with a word-level "unigram" vocabulary of the top-k words of the
user data (k = 10K or 32K; :class:`WordTokenizer`); Wang et al. replace it with a public
sub-word SentencePiece tokenizer (:class:`SentencePieceTokenizer`, trained here on the public
pool with :func:`train_sentencepiece`). To compare the two in their Figure 1 they convert
next-*word* accuracy into next-*token* accuracy by splitting each word with the SentencePiece
tokenizer and counting all tokens of a word as correct iff the word was predicted correctly
(:func:`word_to_token_accuracy`).

All tokenizers share one interface (:class:`Tokenizer`) and the special ids

    PAD = 0, UNK (OOV) = 1, BOS = 2, EOS = 3,

defined here once (:data:`PAD_ID` ... :data:`EOS_ID`) for the whole library. The public
tokenizer trained on the public pool is :func:`fedpriv.data.public_pool.public_sentencepiece`.

``encode`` returns the ids of the text only; BOS/EOS are added when examples are built
(:meth:`fedpriv.data.federated.FederatedDataset.from_text`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import pathlib
import re
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from fedpriv.data import cache as cache_lib
from fedpriv.data.errors import EmptyCorpusError, MissingResourceError, TokenizerError, VocabularyMismatchError, logger
from fedpriv.data.sources import require_file

__all__ = [
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    "SPECIAL_IDS",
    "SpecialIds",
    "Tokenizer",
    "SentencePieceTokenizer",
    "train_sentencepiece",
    "WordTokenizer",
    "split_words",
    "load_tokenizer",
    "check_ids",
    "TokenAccuracy",
    "word_to_token_accuracy",
    "tokens_per_vocab_word",
    "word_ids_to_token_accuracy",
]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int = PAD_ID
    unk: int = UNK_ID
    bos: int = BOS_ID
    eos: int = EOS_ID

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.pad, self.unk, self.bos, self.eos)


SPECIAL_IDS = SpecialIds()
_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")


@runtime_checkable
class Tokenizer(Protocol):
    """Common tokenizer interface.

    ``encode(texts) -> list[list[int]]`` (ids of each text, no BOS/EOS, all in
    ``[0, vocab_size)``); ``decode(ids) -> list[str]`` (specials PAD/BOS/EOS skipped);
    ``vocab_size``; ``special_ids``; ``pad_id``/``unk_id``/``bos_id``/``eos_id``.
    """

    name: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def special_ids(self) -> SpecialIds: ...

    def encode(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]: ...


class _SpecialsMixin:
    special_ids = SPECIAL_IDS
    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID


def check_ids(ids: np.ndarray | Sequence[Sequence[int]], vocab_size: int, what: str = "ids"
              ) -> None:
    """Raise :class:`VocabularyMismatchError` unless every id is in ``[0, vocab_size)``."""
    if isinstance(ids, np.ndarray):
        arr = ids
    else:
        flat = [i for seq in ids for i in seq]
        arr = np.asarray(flat, dtype=np.int64)
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise VocabularyMismatchError(
            f"{what}: token id {hi if hi >= vocab_size else lo} is outside [0, {vocab_size}) "
            f"(vocab_size={vocab_size}); the data was tokenized with a different vocabulary")


# --------------------------------------------------------------------------------------------
# SentencePiece (public, sub-word)
# --------------------------------------------------------------------------------------------

def _spm():
    try:
        import sentencepiece as spm
    except ImportError as e:  # pragma: no cover - sentencepiece is pinned in requirements.txt
        raise MissingResourceError("Python package `sentencepiece`",
                                   "run `make setup` (pip install -r requirements.txt)") from e
    return spm


class SentencePieceTokenizer(_SpecialsMixin):
    """A SentencePiece model with ``pad_id=0, unk_id=1, bos_id=2, eos_id=3``.

    Construct with :func:`train_sentencepiece` or :meth:`load`; persist with :meth:`save`.
    """

    def __init__(self, model_proto: bytes, name: str = "sentencepiece", *, source: str = "model proto"):
        spm = _spm()
        self._proto = bytes(model_proto)
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        except RuntimeError as e:  # sentencepiece says only "INTERNAL: ... ParseFromArray"
            raise TokenizerError(f"{source} is not a valid SentencePiece model "
                                 f"({len(self._proto)} bytes that do not parse)") from e
        got = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if got != SPECIAL_IDS.as_tuple():
            raise VocabularyMismatchError(
                f"SentencePiece model has special ids (pad, unk, bos, eos) = {got}; fedpriv needs "
                f"{SPECIAL_IDS.as_tuple()} (train it with train_sentencepiece)")
        self.name = name

    @classmethod
    def load(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
        p = require_file(path, "SentencePiece model file",
                         "train one with fedpriv.data.tokenizers.train_sentencepiece")
        return cls(p.read_bytes(), name=p.stem, source=f"SentencePiece model file {str(p)!r}")

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        p = pathlib.Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self._proto)
        return p

    @property
    def model_proto(self) -> bytes:
        return self._proto

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """list[str] -> list of id lists (no BOS/EOS)."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not a single string")
        return [list(x) for x in self._sp.encode(list(texts), out_type=int)]

    def encode_pieces(self, texts: Sequence[str]) -> list[list[str]]:
        return [list(x) for x in self._sp.encode(list(texts), out_type=str)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Id lists -> strings; PAD/BOS/EOS are dropped, UNK decodes as `` ⁇ ``."""
        check_ids(ids, self.vocab_size, f"{self.name}.decode")
        return [self._sp.decode([int(i) for i in seq if i not in (PAD_ID, BOS_ID, EOS_ID)])
                for seq in ids]

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def tokens_per_word(self, words: Sequence[str]) -> np.ndarray:
        """int64[num_words]: how many tokens SentencePiece splits each word into (each word
        encoded on its own, i.e. as a word that follows a space)."""
        return np.array([len(x) for x in self.encode(list(words))], dtype=np.int64)


def train_sentencepiece(texts: Iterable[str], vocab_size: int = 8000, *,
                        model_type: str = "unigram", character_coverage: float = 0.9995,
                        max_sentence_length: int = 4192, num_threads: int = 2,
                        cache_dir: str | os.PathLike | None = None, use_cache: bool = True
                        ) -> SentencePieceTokenizer:
    """Train a SentencePiece model (``pad=0, unk=1, bos=2, eos=3``) on ``texts`` (one sentence
    each; the paper's public corpus, here :func:`~fedpriv.data.public_pool.load_public_pool`).

    The model is cached under ``<cache>/tokenizers/`` by a hash of the texts and the options: a
    second call with the same inputs just loads the file. ``vocab_size`` is a soft limit
    (``hard_vocab_limit=False``): on a small corpus SentencePiece may stop below it rather than
    fail; the actual size is ``tokenizer.vocab_size``.
    """
    spm = _spm()
    if int(vocab_size) <= len(_SPECIAL_TOKENS):
        raise TokenizerError(f"train_sentencepiece: vocab_size={vocab_size} leaves no room for "
                             f"pieces beside the {len(_SPECIAL_TOKENS)} special tokens "
                             "(PAD/UNK/BOS/EOS); use a few hundred or more")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise EmptyCorpusError("train_sentencepiece: no non-empty training sentences")
    options = dict(vocab_size=int(vocab_size), model_type=model_type,
                   character_coverage=float(character_coverage),
                   max_sentence_length=int(max_sentence_length))
    path = None
    if use_cache:
        key = cache_lib.cache_key("spm", 1, [cache_lib.texts_digest(texts)], options)
        path = cache_lib.resolve_cache_dir(cache_dir) / "tokenizers" / f"{key}.model"
        if path.is_file():
            try:
                return SentencePieceTokenizer(path.read_bytes(), name=f"spm{vocab_size}",
                                              source=f"cached model {str(path)!r}")
            except (TokenizerError, VocabularyMismatchError) as e:  # a corrupt entry: retrain
                logger.warning("%s; training it again", e)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=int(vocab_size),
            model_type=model_type, character_coverage=float(character_coverage),
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece=_SPECIAL_TOKENS[0], unk_piece=_SPECIAL_TOKENS[1],
            bos_piece=_SPECIAL_TOKENS[2], eos_piece=_SPECIAL_TOKENS[3],
            hard_vocab_limit=False, input_sentence_size=0, shuffle_input_sentence=False,
            max_sentence_length=int(max_sentence_length), num_threads=int(num_threads),
            minloglevel=2)
    except RuntimeError as e:  # "INTERNAL: src/trainer_interface.cc(638) [...] <reason>"
        reason = str(e).split("] ", 1)[-1].strip() or str(e).strip()
        raise TokenizerError(
            f"train_sentencepiece: vocab_size={vocab_size} is too small for these {len(texts):,} "
            f"sentences or the options are invalid (SentencePiece: {' '.join(reason.split())})"
        ) from e
    tok = SentencePieceTokenizer(model.getvalue(), name=f"spm{vocab_size}")
    if path is not None:
        cache_lib.try_write(path, lambda f: f.write(tok.model_proto))  # an unwritable cache: bypassed
    return tok


# --------------------------------------------------------------------------------------------
# Word level (top-k words of the user data)
# --------------------------------------------------------------------------------------------

# A word is a run of letters/digits/underscores, possibly with inner apostrophes ("don't",
# "o'clock"); every other non-space character is a token of its own (punctuation).
_WORD_RE = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")


def split_words(text: str, lowercase: bool = True) -> list[str]:
    """The word splitting of :class:`WordTokenizer`: (optionally) lower-case, then take words =
    maximal runs of letters/digits/``_`` with inner apostrophes (``"don't"`` is one word), and
    every other non-space character (punctuation) as a word of its own.

    >>> split_words("Don't panic, Mr. Smith!")
    ["don't", 'panic', ',', 'mr', '.', 'smith', '!']
    """
    return _WORD_RE.findall(text.lower() if lowercase else text)


class WordTokenizer(_SpecialsMixin):
    """Word-level tokenizer: vocabulary = 4 specials + the top-k most frequent words of a corpus
    (the private user data in prior FL work; Wang et al. §3.1 use k = 10K and 32K). Words are
    split with :func:`split_words`; words outside the vocabulary map to UNK (id 1).

    ``vocab_size = 4 + len(words)`` (10,004 for k = 10K, as for the StackOverflow NWP model).
    Ties in frequency are broken alphabetically, so fitting is deterministic.
    """

    def __init__(self, words: Sequence[str], *, lowercase: bool = True, name: str = "word"):
        words = list(words)
        if len(set(words)) != len(words):
            raise TokenizerError("WordTokenizer: duplicate words in the vocabulary")
        if any(w in _SPECIAL_TOKENS for w in words):
            raise TokenizerError(f"WordTokenizer: vocabulary words may not be one of {_SPECIAL_TOKENS}")
        self._itos = list(_SPECIAL_TOKENS) + words
        self._stoi = {w: i for i, w in enumerate(self._itos)}
        self.lowercase = lowercase
        self.name = name

    @classmethod
    def fit(cls, texts: Iterable[str], k: int = 10_000, *, lowercase: bool = True,
            min_count: int = 1) -> WordTokenizer:
        """The top-``k`` words (by count, ``>= min_count``) of ``texts``."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise TokenizerError(f"WordTokenizer.fit: k must be >= 1, got {k!r} (vocab_size = k + 4 "
                                 "special tokens)")
        counts: collections.Counter[str] = collections.Counter()
        for t in texts:
            counts.update(split_words(t, lowercase))
        if not counts:
            raise EmptyCorpusError("WordTokenizer.fit: the corpus has no words")
        ranked = sorted((w for w, c in counts.items() if c >= min_count and w not in _SPECIAL_TOKENS),
                        key=lambda w: (-counts[w], w))
        return cls(ranked[:k], lowercase=lowercase, name=f"word{k}")

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordTokenizer:
        p = require_file(path, "word vocabulary file",
                         "create one with WordTokenizer.fit(...).save(path)")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise TokenizerError(f"word vocabulary file {str(p)!r} is not valid JSON "
                                 f"({type(e).__name__}: {e})") from e
        if (not isinstance(d, dict) or d.get("type") != "word"
                or d.get("specials") != list(_SPECIAL_TOKENS)
                or not isinstance(d.get("words"), list)
                or not all(isinstance(w, str) for w in d["words"])
                or not isinstance(d.get("lowercase"), bool)):
            raise TokenizerError(f"{p} is not a fedpriv word vocabulary (expected a JSON object "
                                 "with type 'word', specials, words and lowercase; write one with "
                                 "WordTokenizer.save)")
        try:
            return cls(d["words"], lowercase=d["lowercase"], name=str(d.get("name", p.stem)))
        except ValueError as e:
            raise TokenizerError(f"{p}: {e}") from e

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        p = pathlib.Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"type": "word", "name": self.name, "lowercase": self.lowercase,
                                 "specials": list(_SPECIAL_TOKENS), "words": self._itos[4:]},
                                ensure_ascii=False), encoding="utf-8")
        return p

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def words(self) -> list[str]:
        """The vocabulary words, most frequent first (ids 4, 5, ...)."""
        return self._itos[4:]

    def split(self, text: str) -> list[str]:
        return split_words(text, self.lowercase)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """list[str] -> id lists (no BOS/EOS); out-of-vocabulary words -> UNK_ID."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not a single string")
        get = self._stoi.get
        return [[get(w, UNK_ID) for w in self.split(t)] for t in texts]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Id lists -> space-joined words; PAD/BOS/EOS dropped, UNK shown as ``<unk>``."""
        check_ids(ids, self.vocab_size, f"{self.name}.decode")
        return [" ".join(self._itos[int(i)] for i in seq if i not in (PAD_ID, BOS_ID, EOS_ID))
                for seq in ids]

    def oov_rate(self, texts: Sequence[str]) -> float:
        """Fraction of words of ``texts`` that are out of vocabulary."""
        ids = [i for seq in self.encode(texts) for i in seq]
        return float(np.mean(np.asarray(ids) == UNK_ID)) if ids else 0.0


def load_tokenizer(path: str | os.PathLike) -> SentencePieceTokenizer | WordTokenizer:
    """Load a tokenizer saved by either class (``.json`` = word level, else SentencePiece)."""
    p = pathlib.Path(path)
    return WordTokenizer.load(p) if p.suffix == ".json" else SentencePieceTokenizer.load(p)


# --------------------------------------------------------------------------------------------
# Next-word -> next-token accuracy (Wang et al. §3.1, Figure 1)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TokenAccuracy:
    """``accuracy = correct_tokens / total_tokens``; also the plain word accuracy."""

    accuracy: float
    correct_tokens: int
    total_tokens: int
    word_accuracy: float
    words: int


def word_to_token_accuracy(correct: np.ndarray | Sequence[bool], words: Sequence[str],
                           sp_tokenizer, *, mask: np.ndarray | Sequence[bool] | None = None
                           ) -> TokenAccuracy:
    """Convert next-word prediction results into next-token accuracy (Wang et al. §3.1).

    Each target word ``words[i]`` is split with the SentencePiece tokenizer into ``n_i >= 1``
    tokens; all ``n_i`` tokens count as correct iff the word was predicted correctly
    (``correct[i]``)::

        token_accuracy = sum_i n_i * correct_i / sum_i n_i        (over words with mask_i)

    Args:
      correct: bool[N], whether the next-word model predicted word i correctly.
      words: N target words (strings, e.g. from :func:`split_words`).
      sp_tokenizer: anything with ``encode(list[str]) -> list[list[int]]`` (a
        :class:`SentencePieceTokenizer`); each word is encoded on its own.
      mask: optional bool[N]; False entries are excluded (e.g. OOV words, which the paper's
        in-vocabulary accuracy excludes, or padding).
    Returns:
      :class:`TokenAccuracy`. A word that SentencePiece maps to zero tokens counts as one.
    """
    c = np.asarray(correct, dtype=bool).reshape(-1)
    if len(words) != c.size:
        raise ValueError(f"{c.size} correctness flags but {len(words)} words")
    m = np.ones_like(c) if mask is None else np.asarray(mask, dtype=bool).reshape(-1)
    if m.size != c.size:
        raise ValueError(f"mask has {m.size} entries, expected {c.size}")
    n_tok = np.array([max(len(x), 1) for x in sp_tokenizer.encode(list(words))], dtype=np.int64) \
        if len(words) else np.zeros(0, np.int64)
    n_tok = np.where(m, n_tok, 0)
    total = int(n_tok.sum())
    correct_tok = int((n_tok * c).sum())
    nw = int(m.sum())
    return TokenAccuracy(accuracy=correct_tok / total if total else float("nan"),
                         correct_tokens=correct_tok, total_tokens=total,
                         word_accuracy=float((c & m).sum() / nw) if nw else float("nan"), words=nw)


def tokens_per_vocab_word(word_tokenizer: WordTokenizer, sp_tokenizer) -> np.ndarray:
    """int64[V_word]: how many SentencePiece tokens each word of the word-level vocabulary splits
    into (0 for the specials PAD/UNK/BOS/EOS, which are never scored)."""
    n = np.zeros(word_tokenizer.vocab_size, dtype=np.int64)
    words = word_tokenizer.words
    if words:
        n[4:] = [max(len(x), 1) for x in sp_tokenizer.encode(words)]
    return n


def word_ids_to_token_accuracy(targets: np.ndarray, predictions: np.ndarray,
                               word_tokenizer: WordTokenizer, sp_tokenizer, *,
                               pieces: np.ndarray | None = None) -> TokenAccuracy:
    """Next-token accuracy of a word-level LM's predictions (Wang et al. §3.1, Figure 1).

    Args:
      targets: int[..., L] next-word target ids of the word-level vocabulary.
      predictions: int[..., L] predicted ids (same shape; e.g. ``argmax`` of the logits).
      word_tokenizer, sp_tokenizer: the word vocabulary and the SentencePiece tokenizer.
      pieces: optional precomputed :func:`tokens_per_vocab_word` (saves re-encoding).
    Returns:
      :class:`TokenAccuracy`; positions whose target is PAD, BOS, EOS or UNK (OOV) are
      excluded, as in the paper's in-vocabulary accuracy. Each remaining target word weighs
      as many tokens as SentencePiece splits it into, and is correct iff prediction == target.
    """
    t = np.asarray(targets)
    p = np.asarray(predictions)
    if t.shape != p.shape:
        raise ValueError(f"targets {t.shape} and predictions {p.shape} differ in shape")
    check_ids(t, word_tokenizer.vocab_size, "targets")
    n = tokens_per_vocab_word(word_tokenizer, sp_tokenizer) if pieces is None else np.asarray(pieces)
    w = n[t]                                     # 0 for PAD/UNK/BOS/EOS targets
    hit = (p == t)
    total = int(w.sum())
    correct = int((w * hit).sum())
    scored = w > 0
    nw = int(scored.sum())
    return TokenAccuracy(accuracy=correct / total if total else float("nan"),
                         correct_tokens=correct, total_tokens=total,
                         word_accuracy=float((hit & scored).sum() / nw) if nw else float("nan"),
                         words=nw)
