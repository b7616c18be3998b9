"""Command-line helpers shared by fedpriv's entry points (``fedpriv privacy ...``, ``fedpriv
audit ...``): an ``argparse`` parser whose errors are one line with status 2 and that refuses an
option given twice, and :func:`one_line`. A leaf module (it imports nothing of fedpriv), so
``fedpriv.cli`` and ``fedpriv.audit.cli`` share it without importing each other.
"""
from __future__ import annotations

import argparse

__all__ = ["Parser", "one_line"]


def one_line(message: str) -> str:
    """``message`` on one printable line: whitespace runs become one space, other unprintable
    characters (a user's ``\x1e`` or ``\u2028`` splits lines too) are escaped."""
    text = " ".join(str(message).split())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _once(base):
    """``base`` action that refuses its option given twice (``--noise-multiplier 1 ...
    --noise-multiplier 100`` is two conflicting settings, never the last one silently)."""
    class Once(base):
        def __call__(self, parser, namespace, values, option_string=None):
            seen = namespace.__dict__.setdefault("_options_given", set())
            if self.dest in seen:
                parser.error(f"{'/'.join(self.option_strings)} is given twice")
            seen.add(self.dest)
            super().__call__(parser, namespace, values, option_string)
    return Once


class Parser(argparse.ArgumentParser):
    """One-line errors (status 2); every option at most once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _once(argparse._StoreAction))
        self.register("action", "store", _once(argparse._StoreAction))
        self.register("action", "store_true", _once(argparse._StoreTrueAction))

    def error(self, message):  # one line, status 2
        self.exit(2, f"error: {one_line(message)}\n")

    def parse_args(self, args=None, namespace=None):
        ns = super().parse_args(args, namespace)
        ns.__dict__.pop("_options_given", None)
        return ns
