"""TensorFlow Datasets builders for fedpriv's corpora (array_record; no TensorFlow needed).

Each corpus of :mod:`fedpriv.data.corpora` and the public pool (:mod:`fedpriv.data.public_pool`)
is also an ordinary TFDS dataset, so users can ``download_and_prepare`` it once and read it with
``builder.as_data_source()`` (random access over ArrayRecord files; works without TensorFlow
installed):

===================  =======================================  =================================
TFDS name            features                                 from
===================  =======================================  =================================
fedpriv_chitchat     client_id, text                          :func:`load_chitchat`
fedpriv_shakespeare  client_id, text                          :func:`load_shakespeare`
fedpriv_simpsons     client_id, text                          :func:`load_simpsons`
fedpriv_public_pool  client_id (document), text, source       :func:`load_public_pool`
===================  =======================================  =================================

One split, ``'train'``, holding every client's examples in client order (shuffling disabled);
split by client with :meth:`FederatedText.split_by_client` after reading back with
:func:`federated_text_from_source`. Configs: ``'full'`` and ``'tiny'`` (the first 8 clients /
documents, for tests), or any :class:`CorpusConfig` with ``max_clients`` set.

Example::

    builder = prepare("fedpriv_simpsons", data_dir="~/tensorflow_datasets", config="tiny")
    source = builder.as_data_source()["train"]     # source[i] -> {'client_id': b'..', ...}
    text = federated_text_from_source(source)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import tensorflow_datasets as tfds

from fedpriv.data import corpora, public_pool
from fedpriv.data.text import FederatedText, PublicCorpus

__all__ = [
    "CorpusConfig",
    "FedprivChitchat",
    "FedprivShakespeare",
    "FedprivSimpsons",
    "FedprivPublicPool",
    "BUILDERS",
    "prepare",
    "federated_text_from_source",
]


@dataclasses.dataclass(eq=False)
class CorpusConfig(tfds.core.BuilderConfig):
    """``max_clients``: keep only the first clients (sorted ids; documents for the public pool)."""

    max_clients: int | None = None


_CONFIGS = [
    CorpusConfig(name="full", description="The whole corpus."),
    CorpusConfig(name="tiny", max_clients=8, description="First 8 clients (tests, demos)."),
]


class _FederatedTextBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared builder: one 'train' split of (client_id, text) records in client order.

    ``cache_dir`` is passed to the fedpriv loader (its parse cache); ``loader_kwargs`` are
    extra loader options (part of the data, so give each variant its own ``data_dir``).
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = _CONFIGS
    DEFAULT_CONFIG_NAME = "full"
    _DESCRIPTION = ""
    _HOMEPAGE = ""

    def __init__(self, *, cache_dir: str | os.PathLike | None = None,
                 loader_kwargs: Mapping | None = None, **kwargs):
        self._fedpriv_cache_dir = cache_dir
        self._loader_kwargs = dict(loader_kwargs or {})
        super().__init__(**kwargs)

    def _features(self) -> dict:
        return {"client_id": tfds.features.Text(), "text": tfds.features.Text()}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=self._DESCRIPTION,
            features=tfds.features.FeaturesDict(self._features()),
            homepage=self._HOMEPAGE or None, disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local, installed by `make setup`
        return {"train": self._generate_examples()}

    def _load(self) -> FederatedText:
        raise NotImplementedError  # pragma: no cover - abstract in spirit; subclasses define it

    def _generate_examples(self):
        corpus = self._load()
        ids = corpus.client_ids[: self.builder_config.max_clients]
        key = 0
        for cid in ids:
            for text in corpus[cid]:
                yield key, {"client_id": cid, "text": text}
                key += 1

    def _loader_args(self) -> dict:
        return dict(self._loader_kwargs, cache_dir=self._fedpriv_cache_dir, progress=False)


class FedprivChitchat(_FederatedTextBuilder):
    """Chit Chat Challenge messages keyed by sender (see :func:`load_chitchat`)."""

    _DESCRIPTION = "Chit Chat Challenge chat messages; client = sender (fedpriv.load_chitchat)."
    _HOMEPAGE = "https://github.com/BYU-PCCL/chitchat-dataset"

    def _load(self) -> FederatedText:
        return corpora.load_chitchat(**self._loader_args())


class FedprivShakespeare(_FederatedTextBuilder):
    """Shakespeare sentences keyed by (play, role) (see :func:`load_shakespeare`)."""

    _DESCRIPTION = "Shakespeare's plays; client = (play, role) as in LEAF (fedpriv)."

    def _load(self) -> FederatedText:
        return corpora.load_shakespeare(**self._loader_args())


class FedprivSimpsons(_FederatedTextBuilder):
    """Simpsons lines keyed by speaker (see :func:`load_simpsons`)."""

    _DESCRIPTION = "The Simpsons lines from popquotes; client = speaker (fedpriv)."

    def _load(self) -> FederatedText:
        return corpora.load_simpsons(**self._loader_args())


class FedprivPublicPool(_FederatedTextBuilder):
    """The public pool (see :func:`load_public_pool`): client_id = source document."""

    _DESCRIPTION = ("Public sentences (Wikipedia excerpt, Lee news, film quotes) with their "
                    "source label; client_id = document (fedpriv.load_public_pool).")

    def _features(self) -> dict:
        return dict(super()._features(), source=tfds.features.Text())

    def _generate_examples(self):
        pool: PublicCorpus = public_pool.load_public_pool(**self._loader_args())
        keep = None
        if self.builder_config.max_clients is not None:
            keep = set(sorted(set(pool.doc_ids))[: self.builder_config.max_clients])
        key = 0
        for text, source, doc in zip(pool.texts, pool.sources, pool.doc_ids):
            if keep is None or doc in keep:
                yield key, {"client_id": doc, "text": text, "source": source}
                key += 1


BUILDERS: dict[str, type[_FederatedTextBuilder]] = {
    "fedpriv_chitchat": FedprivChitchat,
    "fedpriv_shakespeare": FedprivShakespeare,
    "fedpriv_simpsons": FedprivSimpsons,
    "fedpriv_public_pool": FedprivPublicPool,
}


def prepare(name: str, data_dir: str | os.PathLike, *, config: str | CorpusConfig = "full",
            cache_dir: str | os.PathLike | None = None, loader_kwargs: Mapping | None = None
            ) -> _FederatedTextBuilder:
    """Build (once; later calls reuse the files) and return the builder of corpus ``name`` with
    ``file_format='array_record'``. Read it with ``builder.as_data_source()['train']``."""
    if name not in BUILDERS:
        raise KeyError(f"unknown corpus {name!r}; have {sorted(BUILDERS)}")
    builder = BUILDERS[name](data_dir=os.fspath(os.path.expanduser(data_dir)), config=config,
                             file_format="array_record", cache_dir=cache_dir,
                             loader_kwargs=loader_kwargs)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP))
    return builder


def _s(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def federated_text_from_source(source, name: str = "tfds") -> FederatedText:
    """Read a TFDS data source of ``{'client_id', 'text', ...}`` records back into
    :class:`FederatedText` (client order and example order preserved)."""
    clients: dict[str, list[str]] = {}
    n = len(source)
    step = 4096
    for start in range(0, n, step):
        for rec in source.__getitems__(list(range(start, min(start + step, n)))):
            clients.setdefault(_s(rec["client_id"]), []).append(_s(rec["text"]))
    return FederatedText(clients, name=name)
