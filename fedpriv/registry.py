"""Registries: the names a config chooses among, each bound to one object (docs/design.md §1,
principle 10: registries, not string tables; docs/extending.md).

A :class:`Registry` maps a name to an object. Built-in entries are declared lazily as
``"module:attribute"`` strings, resolved on first use, so importing this module (and a config
that reads the names) loads nothing heavy. ``get(name)`` fails closed: an unknown name raises
:class:`UnknownName` (a ``ConfigError``: one line, listing the registered names). A name is
bound once: registering it again to another object is refused.

**Plugins.** A name ``"<module>:<name>"`` (a dotted module on ``sys.path``, or a path to a
``.py`` file) first imports that module -- which registers what it defines -- then looks up
``<name>``: a config names a researcher's one-file extension, e.g.
``algorithm=my_fedyogi:dp_fedyogi`` or ``arch=/work/gru_lm.py:gru`` (:func:`load_plugin`).

The registries: :data:`MODELS` (an on-device LM architecture: ``factory(LMConfig) -> flax
module``, ``fedpriv.models.lm.make_lm``), :data:`OPTIMIZERS` (``factory(learning_rate,
**options) -> optax.GradientTransformation``: server and client optimizers), :data:`MECHANISMS`
(a ``fedpriv.dp.mechanisms.DPConfig`` subclass), :data:`SAMPLERS` (``factory(num_clients,
cohort_size, seed) -> sampler``), :data:`CORPORA` / :data:`PATH_CORPORA` (the LM corpora:
packaged, or read from ``corpus_path``); the LM-FL algorithms are
``fedpriv.recipes.algorithms.ALGORITHMS``. Fixed choice lists beside them: :data:`BATCHINGS`,
:data:`TOKENIZERS`.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from fedpriv.errors import ConfigError

__all__ = ["Registry", "UnknownName", "UnknownMechanism", "PluginError", "load_plugin", "split_plugin",
           "MODELS", "OPTIMIZERS", "MECHANISMS", "SAMPLERS", "CORPORA", "PATH_CORPORA",
           "BATCHINGS", "TOKENIZERS", "parse_tokenizer"]


class UnknownName(ConfigError):
    """A name no registry entry is bound to (fails closed)."""


class UnknownMechanism(UnknownName):
    """A mechanism name no factory is registered under (fails closed)."""


class PluginError(ConfigError):
    """A plugin module named by a config cannot be imported."""


def split_plugin(name: str) -> tuple[str | None, str]:
    """``"pkg.mod:name"`` / ``"dir/file.py:name"`` -> ``(module, name)``; ``"name"`` -> ``(None,
    "name")``."""
    module, sep, short = str(name).rpartition(":")
    return (module, short) if sep and module else (None, str(name))


def load_plugin(module: str):
    """Import a plugin module: a dotted name on ``sys.path`` or a path to a ``.py`` file (loaded
    once per path, as ``fedpriv_plugin_<stem>``). ``PluginError`` (one line) if it fails."""
    try:
        if module.endswith(".py") or os.sep in module:
            path = os.path.abspath(module)
            key = "fedpriv_plugin_" + "".join(c if c.isalnum() else "_" for c in path)
            if key in sys.modules:
                return sys.modules[key]
            spec = importlib.util.spec_from_file_location(key, path)
            if spec is None or not os.path.isfile(path):
                raise FileNotFoundError(path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[key] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(key, None)
                raise
            return mod
        return importlib.import_module(module)
    except ConfigError:
        raise
    except Exception as err:  # any import failure is the plugin's, in one line
        raise PluginError(f"cannot import plugin {module!r}: {type(err).__name__}: {err}") from err


class Registry:
    """Names bound to objects (module docstring). ``kind`` names the registry in errors;
    ``check``: ``(name, obj) -> None`` validates an entry when it is registered or resolved;
    ``error``: the ``UnknownName`` subclass raised for an unknown name."""

    def __init__(self, kind: str, check: Callable[[str, Any], None] | None = None,
                 error: type = UnknownName):
        self.kind, self._check, self.error = kind, check, error
        self._entries: dict[str, Any] = {}

    def declare(self, name: str, target: str) -> None:
        """Bind ``name`` lazily to ``"module:attribute"`` (resolved by :meth:`get`)."""
        self._entries.setdefault(name, _Lazy(target))

    def register(self, name: str, obj: Any = None):
        """Bind ``name`` to ``obj`` (as a decorator without ``obj``); returns ``obj``. The same
        object again is a no-op; another object under a bound name is refused (``ValueError``)."""
        if obj is None:
            return lambda o: self.register(name, o)
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")
        old = self._entries.get(name)
        if isinstance(old, _Lazy) and old.names(obj):
            old = None  # the declared built-in itself, registered by its module
        if old is not None and old is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered (to {_describe(old)})")
        if self._check is not None:
            self._check(name, obj)
        self._entries[name] = obj
        return obj

    def get(self, name: str) -> Any:
        """The object bound to ``name`` (a plugin name imports its module first)."""
        module, short = split_plugin(name)
        if module is not None:
            load_plugin(module)
        try:
            entry = self._entries[short]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.kind} {short!r}; registered: "
                             f"{', '.join(sorted(self._entries)) or '(none)'}") from None
        if isinstance(entry, _Lazy):
            obj = entry.resolve(self.kind, short)
            if self._check is not None:
                self._check(short, obj)
            self._entries[short] = obj
            return obj
        return entry

    def check(self, name: str) -> str:
        """``name`` if it resolves (:meth:`get`), else the registry's one-line error."""
        self.get(name)
        return name

    def known(self, name) -> bool:
        """Whether ``name`` is bound, without resolving a lazy built-in (cheap: what a config's
        ``__post_init__`` asks); a plugin name imports its module first."""
        if not isinstance(name, str):
            return False
        module, short = split_plugin(name)
        if module is not None:
            load_plugin(module)
        return short in self._entries

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name) -> bool:
        return split_plugin(name)[1] in self._entries if isinstance(name, str) else False

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"


class _Lazy:
    def __init__(self, target: str):
        self.target = target

    def names(self, obj) -> bool:
        return f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}" == self.target

    def resolve(self, kind: str, name: str):
        module, attr = self.target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as err:
            raise PluginError(f"{kind} {name!r} needs {module} ({type(err).__name__}: {err})") from err

    def __repr__(self) -> str:
        return self.target


def _describe(obj) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


# ----------------------------------------------------------------------------- the registries
MODELS = Registry("model architecture")
MODELS.declare("lstm", "fedpriv.models.lm:LSTMLM")
MODELS.declare("transformer", "fedpriv.models.lm:TransformerLM")

OPTIMIZERS = Registry("optimizer")
for _name in ("sgd", "sgdm", "adam"):
    OPTIMIZERS.declare(_name, f"fedpriv.fl.optimizers:{_name}")

MECHANISMS = Registry("DP mechanism", error=UnknownMechanism)
for _name, _cls in (("gaussian", "GaussianMechanism"), ("tree", "TreeMechanism"),
                    ("banded", "BandedMechanism"), ("blt", "BLTMechanism"), ("ddg", "DDGMechanism")):
    MECHANISMS.declare(_name, f"fedpriv.dp.mechanisms:{_cls}")
# banded MF with jax_privacy-optimised coefficients: its own file (the "mf" extra)
MECHANISMS.declare("banded_opt", "fedpriv.dp.optimized_banded:OptimizedBandedMechanism")

SAMPLERS = Registry("client sampler")
for _name in ("shuffled", "poisson", "uniform", "cyclic"):
    SAMPLERS.declare(_name, f"fedpriv.fl.samplers:{_name}_sampler")

CORPORA = Registry("packaged corpus")
for _name in ("chitchat", "shakespeare", "simpsons"):
    CORPORA.declare(_name, f"fedpriv.data.corpora:load_{_name}")
PATH_CORPORA = Registry("corpus read from corpus_path")
PATH_CORPORA.declare("stackoverflow", "fedpriv.data.paper_corpora:load_stackoverflow")
PATH_CORPORA.declare("reddit_jsonl", "fedpriv.data.paper_corpora:load_reddit_jsonl")

# local batchings of the engine (fedpriv.fl.cohort, "Length-aware batches")
BATCHINGS = ("padded", "trimmed", "sorted", "packed")
# the LM recipes' tokenizers (fedpriv.recipes.lm_data.prepare_data)
TOKENIZERS = ("sentencepiece", "word_public", "word")


def parse_tokenizer(spec: str) -> tuple[str, int | None]:
    """A tokenizer spec ``name[:vocab size]``: ``"word:5000"`` -> ``("word", 5000)``,
    ``"sentencepiece"`` -> ``("sentencepiece", None)`` (the config's ``vocab_size``).
    Raises :class:`ConfigError` for anything else."""
    name, sep, size = str(spec).partition(":")
    if name not in TOKENIZERS or (sep and not (size.isdigit() and int(size) > 4)):
        raise ConfigError(f"tokenizer {spec!r}: expected name[:vocab size] with name in {TOKENIZERS} "
                          "and a vocabulary size > 4")
    return name, int(size) if sep else None
