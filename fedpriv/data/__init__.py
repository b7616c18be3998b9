"""fedpriv.data: real federated text corpora, tokenizers and federated datasets.

Implements the data side of Wang et al. 2023 (§2 datasets and FL set-up, §3.1 tokenizers,
App. B): loaders of user-keyed text (chitchat, Shakespeare, Simpsons; TFF StackOverflow SQLite,
JSONL and per-user text files for users with the original data) and of a labelled public pool;
public SentencePiece and word-level top-k tokenizers with the word -> token accuracy conversion;
and :class:`FederatedDataset`, client id -> ``{'tokens': int32[n, L+1]}`` with the papers' caps
(256 examples per client, L = 20, batch 16) and splits by client.

Modules: :mod:`~fedpriv.data.corpora` (private user-keyed corpora), :mod:`~fedpriv.data.formats`
(original-format files), :mod:`~fedpriv.data.public_pool` (public pool and its SentencePiece
tokenizer), :mod:`~fedpriv.data.parsing` (parse/cap/cache shared by the loaders),
:mod:`~fedpriv.data.text`, :mod:`~fedpriv.data.federated`, :mod:`~fedpriv.data.tokenizers`.
TFDS builders live in :mod:`fedpriv.data.tfds_builders` (imported on demand: it imports
tensorflow_datasets).
"""

from fedpriv.data.corpora import load_chitchat, load_shakespeare, load_simpsons
from fedpriv.data.errors import (
    ConfigError,
    DataError,
    EmptyClientError,
    EmptyCorpusError,
    FedprivError,
    MalformedDataError,
    MissingResourceError,
    TokenizerError,
    VocabularyMismatchError,
)
from fedpriv.data.federated import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_EXAMPLES_PER_CLIENT,
    DEFAULT_SEQ_LEN,
    FederatedDataset,
    encode_examples,
)
from fedpriv.data.formats import load_jsonl, load_stackoverflow_sqlite, load_text_dir
from fedpriv.data.public_pool import PUBLIC_SOURCES, load_public_pool, public_sentencepiece
from fedpriv.data.text import (
    FederatedText,
    LoadStats,
    PublicCorpus,
    split_client_ids,
    split_sentences,
)
from fedpriv.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_IDS,
    UNK_ID,
    SentencePieceTokenizer,
    SpecialIds,
    TokenAccuracy,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    split_words,
    tokens_per_vocab_word,
    train_sentencepiece,
    word_ids_to_token_accuracy,
    word_to_token_accuracy,
)

__all__ = [
    "FedprivError", "ConfigError", "DataError", "EmptyClientError", "EmptyCorpusError",
    "MalformedDataError", "MissingResourceError", "VocabularyMismatchError", "TokenizerError",
    "DEFAULT_BATCH_SIZE", "DEFAULT_MAX_EXAMPLES_PER_CLIENT", "DEFAULT_SEQ_LEN",
    "FederatedDataset", "encode_examples",
    "PUBLIC_SOURCES", "load_chitchat", "load_jsonl", "load_public_pool", "load_shakespeare",
    "load_simpsons", "load_stackoverflow_sqlite", "load_text_dir",
    "FederatedText", "LoadStats", "PublicCorpus", "split_client_ids", "split_sentences",
    "BOS_ID", "EOS_ID", "PAD_ID", "SPECIAL_IDS", "UNK_ID", "SentencePieceTokenizer",
    "SpecialIds", "TokenAccuracy", "Tokenizer", "WordTokenizer", "load_tokenizer",
    "split_words", "train_sentencepiece", "word_to_token_accuracy", "public_sentencepiece",
    "tokens_per_vocab_word", "word_ids_to_token_accuracy",
]
