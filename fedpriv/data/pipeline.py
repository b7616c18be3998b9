"""One call from a corpus name to train/validation/test ``FederatedDataset`` s for LM training
(Wang et al. 2023, §2 set-up: per-client caps of 256 sentences, L = 20, batch 16; §3.1
tokenizers).

Order of operations (so nothing private leaks into the held-out splits): load the federated
text -> split the *clients* into train/validation/test with an explicit seed -> build the
tokenizer (the public SentencePiece model, trained on the public pool only; or the word-level
top-k vocabulary fitted on the *training* clients' text only) -> tokenize each split.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from fedpriv.data.corpora import load_chitchat, load_shakespeare, load_simpsons
from fedpriv.data.federated import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_EXAMPLES_PER_CLIENT,
    DEFAULT_SEQ_LEN,
    FederatedDataset,
)
from fedpriv.data.public_pool import public_sentencepiece
from fedpriv.data.text import FederatedText
from fedpriv.data.tokenizers import SentencePieceTokenizer, WordTokenizer

__all__ = ["CORPORA", "load_corpus", "LMData", "lm_datasets"]

CORPORA: Mapping[str, Callable[..., FederatedText]] = {
    "chitchat": load_chitchat,
    "shakespeare": load_shakespeare,
    "simpsons": load_simpsons,
}


def load_corpus(name: str, **kwargs) -> FederatedText:
    """Load a federated corpus by name (``'chitchat'``, ``'shakespeare'``, ``'simpsons'``);
    ``kwargs`` go to its loader."""
    if name not in CORPORA:
        raise KeyError(f"unknown corpus {name!r}; have {sorted(CORPORA)}")
    return CORPORA[name](**kwargs)


@dataclasses.dataclass(frozen=True)
class LMData:
    """Train/validation/test federated LM datasets (disjoint clients) and their tokenizer."""

    train: FederatedDataset
    validation: FederatedDataset
    test: FederatedDataset
    tokenizer: SentencePieceTokenizer | WordTokenizer
    text: FederatedText

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def summary(self) -> dict[str, Any]:
        """``stats()`` of each split plus the tokenizer, for logs and result tables."""
        return dict(tokenizer=self.tokenizer.name, vocab_size=self.vocab_size,
                    train=self.train.stats(), validation=self.validation.stats(),
                    test=self.test.stats())


def lm_datasets(corpus: str | FederatedText, *,
                tokenizer: Literal["sentencepiece", "word"] = "sentencepiece",
                vocab_size: int = 8000, seq_len: int = DEFAULT_SEQ_LEN,
                max_examples_per_client: int | None = DEFAULT_MAX_EXAMPLES_PER_CLIENT,
                batch_size: int = DEFAULT_BATCH_SIZE,
                fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0,
                cache_dir: str | os.PathLike | None = None, progress: bool = False,
                loader_kwargs: Mapping[str, Any] | None = None) -> LMData:
    """Federated LM datasets ``{'tokens': int32[n_c, seq_len + 1]}`` split by client.

    Args:
      corpus: a name from :data:`CORPORA` or an already loaded :class:`FederatedText`.
      tokenizer: ``'sentencepiece'`` = the public SentencePiece model with ``vocab_size``
        pieces (:func:`public_sentencepiece`); ``'word'`` = top-``vocab_size`` words of the
        training clients (vocabulary ``vocab_size + 4``).
      fractions, seed: the client split (``np.random.default_rng(seed)``).
    """
    if isinstance(corpus, str):
        text = load_corpus(corpus, cache_dir=cache_dir, progress=progress,
                           **dict(loader_kwargs or {}))
    else:
        text = corpus
    if len(fractions) != 3:
        raise ValueError(f"fractions must be (train, validation, test), got {fractions}")
    tr, va, te = text.split_by_client(fractions, seed=seed)
    if tokenizer == "sentencepiece":
        tok = public_sentencepiece(vocab_size, cache_dir=cache_dir, progress=progress)
    elif tokenizer == "word":
        tok = WordTokenizer.fit(tr.texts(), k=vocab_size)
    else:
        raise ValueError(f"tokenizer must be 'sentencepiece' or 'word', got {tokenizer!r}")
    kw = dict(seq_len=seq_len, max_examples_per_client=max_examples_per_client,
              batch_size=batch_size)
    return LMData(train=FederatedDataset.from_text(tr, tok, name=f"{text.name}/train", **kw),
                  validation=FederatedDataset.from_text(va, tok, name=f"{text.name}/validation",
                                                        **kw),
                  test=FederatedDataset.from_text(te, tok, name=f"{text.name}/test", **kw),
                  tokenizer=tok, text=text)
