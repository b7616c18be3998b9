"""On-disk cache of processed corpora and trained tokenizers.

Parsing the real corpora (Wang et al. 2023 §2 use StackOverflow; here chitchat, Shakespeare,
Simpsons and a public pool stand in for it, see docs/design.md §4) takes seconds; the processed result
is cached as JSON under a cache directory, keyed by a SHA-256 of the source file contents, the
loader name, its format version and its options. A changed file or option gives a new key, so
a cache entry is never stale.

Cache directory: the ``cache_dir`` argument, else ``$FEDPRIV_CACHE``, else ``~/.cache/fedpriv``.

The cache is an optimisation: a cache directory that cannot be created or written (read-only,
a regular file, a full disk) is bypassed -- one warning on ``logging.getLogger("fedpriv.data")``
per directory, naming it and the reason -- and the data is parsed / trained again
(:func:`try_write`, :func:`try_write_json`). What cannot be bypassed (a decompressed copy that
must exist to be read) is refused in one line (:class:`~fedpriv.data.errors.CacheError`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO

from fedpriv.data.errors import logger

__all__ = [
    "resolve_cache_dir",
    "try_write",
    "try_write_json",
    "warn_unwritable",
    "file_digest",
    "texts_digest",
    "cache_key",
    "read_json",
    "atomic_file",
    "write_json_atomic",
]

ENV_VAR = "FEDPRIV_CACHE"


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The cache directory: ``cache_dir`` if given, else ``$FEDPRIV_CACHE``, else
    ``~/.cache/fedpriv``. Created if missing."""
    if cache_dir is None:
        cache_dir = os.environ.get(ENV_VAR) or os.path.join("~", ".cache", "fedpriv")
    path = pathlib.Path(cache_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a regular file, read-only, full: reads miss, writes are bypassed
        warn_unwritable(path, err, directory=True)
    return path


_WARNED: set = set()


def warn_unwritable(path: str | os.PathLike, err: OSError, *, directory: bool = False) -> None:
    """Warn that the cache at ``path`` (an entry, or a ``directory``) cannot be written: once per
    directory (not again for the entries under a directory already reported)."""
    path = pathlib.Path(path)
    where = path if directory else path.parent
    if any(w == where or w in where.parents for w in _WARNED):
        return
    _WARNED.add(where)
    reason = getattr(err, "strerror", None) or str(err)
    if directory and path.exists() and not path.is_dir():
        reason = "it is a file, not a directory"
    logger.warning("the fedpriv cache cannot be written at %s (%s): bypassed, nothing is cached; "
                   "set %s to a writable directory", path, reason, ENV_VAR)


FULL_HASH_LIMIT = 256 << 20  # bytes


def file_digest(path: str | os.PathLike, chunk_size: int = 1 << 20,
                full_hash_limit: int = FULL_HASH_LIMIT) -> str:
    """SHA-256 hex digest identifying a file's contents.

    Files up to ``full_hash_limit`` bytes (256 MiB; every corpus shipped with the packages) are
    hashed in full. Larger files (e.g. the full TFF StackOverflow SQLite, ~30 GB) would take
    minutes to hash on every load, so they are fingerprinted by size, modification time and the
    hash of their first and last 16 MiB.
    """
    h = hashlib.sha256()
    st = os.stat(path)
    with open(path, "rb") as f:
        if st.st_size <= full_hash_limit:
            while chunk := f.read(chunk_size):
                h.update(chunk)
        else:
            h.update(f"size={st.st_size};mtime_ns={st.st_mtime_ns};".encode())
            h.update(f.read(16 << 20))
            f.seek(st.st_size - (16 << 20))
            h.update(f.read(16 << 20))
    return h.hexdigest()


def texts_digest(texts: Iterable[str]) -> str:
    """SHA-256 hex digest of a sequence of strings (order and boundaries matter)."""
    h = hashlib.sha256()
    n = 0
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
        n += 1
    h.update(n.to_bytes(8, "little"))
    return h.hexdigest()


def cache_key(kind: str, version: int, digests: Iterable[str], options: Mapping[str, Any]) -> str:
    """A short key for a cache entry: hash of (kind, format version, source digests, options).

    ``options`` must be JSON-serialisable; keys are sorted so argument order does not matter.
    """
    payload = json.dumps(
        {"kind": kind, "version": version, "digests": list(digests), "options": dict(options)},
        sort_keys=True,
        default=str,
    )
    return f"{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:24]}"


def read_json(path: pathlib.Path) -> Any | None:
    """The JSON content of ``path``, or ``None`` if it is missing or unreadable (a corrupt
    cache entry is treated as a miss and rewritten)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Write ``path`` atomically: yields a binary file opened on a temporary name next to it
    (unique per writer: ``<name>.<pid>.<random>.tmp``, created exclusively), renamed onto
    ``path`` with :func:`os.replace` when the block ends, removed if it raises. Concurrent
    writers of one cache entry never share a temporary file, and readers never see a
    half-written entry (the last complete write wins)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: pathlib.Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (:func:`atomic_file`), so concurrent readers
    never see a half-written entry."""
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (e.g. an undecodable file name): escape
        data = json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    with atomic_file(path) as f:
        f.write(data)


def try_write(path: pathlib.Path, write: Callable[[BinaryIO], Any]) -> bool:
    """Best effort cache write: ``write(f)`` into :func:`atomic_file` ``path``; an ``OSError``
    (read-only, not a directory, disk full) leaves no entry and is reported by
    :func:`warn_unwritable`. Returns whether the entry was written."""
    try:
        with atomic_file(path) as f:
            write(f)
        return True
    except OSError as err:
        warn_unwritable(path, err)
        return False


def try_write_json(path: pathlib.Path, obj: Any) -> bool:
    """:func:`write_json_atomic`, best effort (:func:`try_write`)."""
    try:
        write_json_atomic(path, obj)
        return True
    except OSError as err:
        warn_unwritable(path, err)
        return False
