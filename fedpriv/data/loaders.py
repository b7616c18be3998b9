"""Old home of the corpus loaders, kept only for ``experiments/fred_table.py``
(``from fedpriv.data import loaders``); new code imports them from :mod:`fedpriv.data`.

The loaders live in :mod:`fedpriv.data.corpora` (chitchat, Shakespeare, Simpsons),
:mod:`fedpriv.data.formats` (StackOverflow SQLite, JSONL, text directories) and
:mod:`fedpriv.data.public_pool` (the public pool).
"""

from fedpriv.data.corpora import load_chitchat, load_shakespeare, load_simpsons
from fedpriv.data.formats import load_jsonl, load_stackoverflow_sqlite, load_text_dir
from fedpriv.data.public_pool import PUBLIC_SOURCES, load_public_pool

__all__ = ["load_chitchat", "load_shakespeare", "load_simpsons", "load_public_pool",
           "load_stackoverflow_sqlite", "load_jsonl", "load_text_dir", "PUBLIC_SOURCES"]
