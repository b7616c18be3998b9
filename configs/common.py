"""Config plumbing shared by every ``configs/<experiment>.py`` (docs/design.md §1.6).

``from_scale(base, scales, "small,rounds=60,seeds=0/1")`` = ``base`` with the scale's overrides,
then ``field=value`` overrides parsed by the type of the field (its annotation, else its current
value). Overrides are strict; anything else is refused with :class:`ConfigError` (a one-line
message naming the field) before any data is loaded:

- ``bool``: exactly ``true``/``false``, ``1``/``0``, ``yes``/``no`` (any case); ``on``, ``y``,
  ``ture`` ... are refused, never read as False;
- ``int``: an integer literal (``2.5``, ``1e3`` are refused: ints must be ints);
- ``float``: a number (``nan`` refused; ``inf`` parses, and every config refuses it:
  :func:`check_limits`);
- tuples: elements separated by ``/``, each parsed like the tuple's elements;
- ``none``: only for fields annotated ``... | None`` (a ``str`` field takes it as the text);
- every override is ``field=value`` (``rounds`` alone: "needs a value"), each field at most once;
  all overrides of one spec are applied together (one ``dataclasses.replace``), so their order
  never matters.

Conflicting settings are refused, never resolved silently:

- **Exclusive fields** (:data:`EXCLUSIVE`: ``noise_multiplier`` / ``target_epsilon``): at most one
  may be set. The rule for a scale that sets one of them (``lm_fl.py:smoke`` sets
  ``target_epsilon=50``): a user override of the *other* one is refused too, naming where each
  value comes from; the user clears the scale's value explicitly
  (``smoke,target_epsilon=None,noise_multiplier=0.05``). A scale's privacy target is never
  dropped behind the user's back. Every config with DP fields follows it (``from_scale`` and
  ``with_lm_config`` build them all).
- **DP settings with a non-private algorithm** (:data:`NONPRIVATE_ALGORITHMS`): a user override of
  a field of :data:`DP_FIELDS` with ``algorithm=fedavg`` is refused ("... are DP settings but
  algorithm=fedavg is non-private"); a scale's DP defaults are not the user's request and stay.
- **Derived fields**: a config that sets a field itself (e.g. ``fred_pipeline`` sets the FL
  stage's ``target_epsilon`` from ``total_epsilon``) refuses a user override of it
  (``derived=`` of :func:`from_scale` / :func:`with_lm_config`), naming the field to use instead.

Numbers (:func:`check_limits`, every config): finite and >= 0, tuple elements too (no field
means "off" by ``inf`` or takes a negative value; :data:`SIGNED` lists exceptions, none today).

Resource limits (:data:`LIMITS`, by exact name, and :data:`LIMIT_SUFFIXES`, by the end of the
name: ``*batch_size``, ``*_batch``, ``*steps``, ``*trials``, ``*num_samples``, ``*_rounds``): fields
that set memory or time (``seq_len``, ``vocab_size``,
``rounds``, model widths, seeds, ...) are checked by :func:`check` against a stated maximum, so a
typo such as ``seq_len=1000000`` is refused in one line before any data is loaded.

Configs validate their values in ``__post_init__`` with :func:`check` (so ``dataclasses.replace``
is checked too): types, ranges, choices, and fractions that must sum to 1 (never renormalised).
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from fedpriv.errors import ConfigError
from fedpriv.registry import Registry
from fedpriv.util import check_delta

__all__ = ["ConfigError", "DP_FIELDS", "EXCLUSIVE", "LIMITS", "NONPRIVATE_ALGORITHMS",
           "SIGNED", "apply_overrides", "check", "check_conflicts", "check_limits", "check_signs", "check_types",
           "from_scale",
           "parse_value", "refuse_derived", "refuse_nonprivate", "split_spec"]
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
_SCALARS = ("bool", "int", "float", "str")

# At most one of each group may be set (a fixed z, or z calibrated to a target epsilon).
EXCLUSIVE = (("noise_multiplier", "target_epsilon"),)
# Algorithms that add no noise: a user's DP setting beside one of them would be ignored.
NONPRIVATE_ALGORITHMS = ("fedavg",)
DP_FIELDS = ("noise_multiplier", "target_epsilon", "delta", "noise_cohort_size", "epsilons")

# Largest accepted value of fields that set memory or time (checked by `check` in every config
# that has the field; names are matched exactly). Each is far beyond the papers' settings and
# stops a typo before it allocates or loops for hours:
MAX_SEED = 2**32 - 1  # JAX keys take < 2^64, NumPy's legacy seeds < 2^32: one range for both
LIMITS = {
    # tokens per example: the LMs' logits are batch x seq_len x vocab floats (papers: 20-30)
    "seq_len": (4096, "tokens per example (the papers use 20-30)"),
    # the output layer and its logits scale with V (papers: 8K-32K; the teacher's BPE 49,152)
    "vocab_size": (262_144, "the output layer and its logits grow with it"),
    "vocab_kept": (262_144, "the output layer and its logits grow with it"),
    "base_vocab": (262_144, "the output layer and its logits grow with it"),
    "train_vocab": (262_144, "the output layer and its logits grow with it"),
    # rounds beyond what the accountants can compose (fedpriv.dp.accounting.MAX_ROUNDS)
    "rounds": (10**6, "accounting for more rounds is not supported"),
    # model widths: parameters grow with their square (papers: 96-670)
    "embed_dim": (16_384, "parameters grow with its square"),
    "hidden_dim": (16_384, "parameters grow with its square"),
    "num_heads": (1024, "attention heads"),
    "batch_size": (65_536, "examples per step held in memory"),
    "eval_batch_size": (65_536, "examples per step held in memory"),
    "max_examples_per_client": (10**6, "examples per client held in memory"),
    "seed": (MAX_SEED, "PRNG seeds"),
    "seeds": (MAX_SEED, "PRNG seeds"),
    "split_seed": (MAX_SEED, "PRNG seeds"),
    "pool_seed": (MAX_SEED, "PRNG seeds"),
    "regime_seeds": (MAX_SEED, "PRNG seeds"),
    "max_new": (4096, "tokens generated per sample (seq_len's limit)"),
    "vocab_words": (262_144, "the output layer and its logits grow with it"),
    "vocabs": (262_144, "the output layer and its logits grow with it"),
    "negative_vocab": (262_144, "the output layer and its logits grow with it"),
    "control_vocab": (262_144, "the output layer and its logits grow with it"),
    # secure aggregation's modulus 2^bits is held in int32 (fedpriv.dp.ddg)
    "ddg_bits": (31, "secure aggregation's modulus 2^bits must fit in 32 bits"),
    "num_points": (100_000, "points per curve, each a computation"),
}
# The same by the end of a field's name, for the fields of LIMITS' kinds that every config
# names its own way (prefinetune_batch, oracle_steps, fred_trials, ...): the exact names above
# win; each limit is far beyond the papers' settings (1.4M pre-training steps, 20K trials).
LIMIT_SUFFIXES = (
    ("batch_size", (65_536, "examples per step held in memory")),
    ("_batch", (65_536, "examples per step held in memory")),
    ("steps", (10**8, "optimisation steps (the papers: up to 1.4M)")),
    ("trials", (10**7, "Monte Carlo trials / releases")),
    ("num_samples", (10**7, "samples generated or scored")),
    ("_rounds", (10**6, "rounds (as rounds)")),
    # privacy budgets: beyond 1e6 there is no privacy to calibrate (fedpriv.dp.moments.MAX_RELEASE_EPSILON)
    ("epsilon", (10**6, "an epsilon this large is no privacy guarantee")),
    ("epsilons", (10**6, "an epsilon this large is no privacy guarantee")),
    ("epsilon0", (10**6, "an epsilon this large is no privacy guarantee")),
    ("epsilons0", (10**6, "an epsilon this large is no privacy guarantee")),
)


def limit_of(name: str):
    """``(limit, why)`` of field ``name`` (:data:`LIMITS`, else :data:`LIMIT_SUFFIXES`), or None."""
    if name in LIMITS:
        return LIMITS[name]
    return next((lim for suffix, lim in LIMIT_SUFFIXES if name.endswith(suffix)), None)
# Fields holding the delta of a stated (epsilon, delta) guarantee: at most MAX_DELTA
# (fedpriv.dp.accounting.check_delta, the rule of every entry point) and > 0.
DELTA_FIELDS = ("delta", "fred_delta")
# Numbers in every config (scalars and tuple elements, checked by `check_limits`): finite (inf
# noise is no release, epsilon 0 no budget anyone can be charged; an infinite learning rate,
# clip norm, temperature or oversampling factor is a typo: no config field means "off" by inf,
# None does) and >= 0 (no field of any config takes a negative number: seeds, sizes, steps,
# rates, budgets, weights). Fields named in SIGNED may be negative (none today).
SIGNED: tuple[str, ...] = ()


def _kinds(annotation) -> set[str]:
    """``"int | None"`` -> ``{"int", "None"}`` (also ``Optional[...]`` and real types)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))
    text = re.sub(r"(?i)tuple\[[^\]]*\]", "tuple", text.replace("typing.", ""))  # tuple[float, ...]
    text = text.replace("Optional[", "None | ").replace("]", "")
    return {k.strip() for k in text.split("|") if k.strip()}


def _tuple_element(annotation) -> str | None:
    """``"tuple[float, ...] | None"`` -> ``"float"``: a tuple field's element kind where the
    annotation names one (a field that defaults to None has no element to read it from)."""
    text = annotation if isinstance(annotation, str) else str(annotation)
    m = re.search(r"tuple\[\s*(\w+)", text.replace("typing.", "").replace("Tuple[", "tuple["))
    return m.group(1) if m and m.group(1) in _SCALARS else None


def _kind_of(kinds: set[str], current) -> str | None:
    """The scalar kind a field holds: from its annotation, else from its current value."""
    for k in _SCALARS:
        if k in kinds:
            return k
    if current is not None and type(current).__name__ in _SCALARS:
        return type(current).__name__
    return None


def _scalar(name: str, kind: str | None, text: str):
    t = text.strip()
    if kind == "bool":
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise ConfigError(f"override {name!r}: expected a boolean (true/false/1/0/yes/no), "
                          f"got {text!r}")
    if kind == "int":
        try:
            return int(t)
        except ValueError:
            raise ConfigError(f"override {name!r}: expected an integer, got {text!r}") from None
    if kind == "float":
        try:
            v = float(t)
        except ValueError:
            v = math.nan
        if math.isnan(v):
            raise ConfigError(f"override {name!r}: expected a number, got {text!r}")
        return v
    return text


def parse_value(current, annotation, text: str, name: str = "value"):
    """``text`` converted for field ``name`` of type ``annotation`` holding ``current``."""
    kinds = _kinds(annotation)
    is_tuple = "tuple" in kinds or isinstance(current, tuple)
    if text.strip().lower() == "none" and ("None" in kinds or not is_tuple):
        if "None" in kinds:
            return None
        if _kind_of(kinds, current) != "str":
            shown = " | ".join(sorted(kinds)) or type(current).__name__
            raise ConfigError(f"override {name!r}: None is not allowed (type {shown})")
        return text
    if is_tuple:  # "none" here is an element (public_training's rows=none: the no-public-data row)
        elem = _tuple_element(annotation) or (type(current[0]).__name__ if current else "str")
        if not text.strip():
            return ()
        parts = text.split("/")
        if any(not p.strip() for p in parts):
            raise ConfigError(f"override {name!r}: empty element in {text!r} (tuples are a/b/c)")
        return tuple(_scalar(name, elem if elem in _SCALARS else "str", p) for p in parts)
    return _scalar(name, _kind_of(kinds, current), text)


def _origin(name: str, user: set | None, scale: str | None, scale_fields) -> str:
    if user is None:
        return ""
    if name in user:
        return " (your override)"
    if scale is not None and name in scale_fields:
        return f" (from scale {scale!r})"
    return " (the default)"


def check_conflicts(values: dict, user: set | None, scale: str | None = None,
                    scale_fields=()) -> None:
    """Refuse exclusive fields both set and user-set DP fields beside a non-private algorithm
    (module docstring). ``values``: the config's final field values; ``user``: the fields the
    user overrode (None: unknown, e.g. a ``dataclasses.replace``); ``scale_fields``: those
    ``scale`` set."""
    for group in EXCLUSIVE:
        present = [n for n in group if n in values and values[n] is not None]
        if len(present) > 1:
            shown = ", ".join(f"{n}={values[n]!r}{_origin(n, user, scale, scale_fields)}"
                              for n in present)
            fix = [n for n in present if n not in (user or ())]
            hint = (f"; add {fix[0]}=None to use {', '.join(n for n in present if n in user)}"
                    if fix and len(fix) < len(present) else "; set only one of them")
            raise ConfigError(f"{' and '.join(present)} are both set ({shown}): they are "
                              f"exclusive{hint}")
    alg = values.get("algorithm")
    if user and alg in NONPRIVATE_ALGORITHMS:
        bad = [n for n in DP_FIELDS if n in user and n in values and values[n] is not None]
        if bad:
            raise ConfigError(f"{', '.join(bad)} {'is a DP setting' if len(bad) == 1 else 'are DP settings'}"
                              f" but algorithm={alg} is non-private (choose a DP algorithm, e.g. "
                              "algorithm=dp_ftrl, or drop the DP settings)")


def refuse_nonprivate(algorithm: str, budget_field: str) -> None:
    """Refuse a non-private ``algorithm`` in an experiment whose FL stage spends ``budget_field``."""
    if algorithm in NONPRIVATE_ALGORITHMS:
        raise ConfigError(f"{budget_field} is a DP setting but algorithm={algorithm} is "
                          "non-private (this experiment's FL stage is DP: choose a DP algorithm)")


def refuse_derived(names, derived: dict | None) -> None:
    """Refuse a user override of a field the config sets itself (``derived``: field -> why)."""
    for n in names:
        if derived and n in derived:
            raise ConfigError(f"{n} cannot be overridden here: {derived[n]}")


def apply_overrides(cfg, overrides, *, scale: str | None = None, scale_fields=()):
    """``cfg`` with ``["field=value", ...]`` applied together (one ``dataclasses.replace``);
    unknown fields, missing values, repeated fields and conflicting settings
    (:func:`check_conflicts`; ``scale``/``scale_fields`` say where ``cfg``'s own values came
    from) are errors (:class:`ConfigError`)."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    seen: set[str] = set()
    changes = {}
    for ov in overrides:
        key, sep, val = ov.partition("=")
        key = key.strip()
        if not sep:
            if key in fields:
                raise ConfigError(f"override {key!r} needs a value: {key}=...")
            raise ConfigError(f"unknown config field {key!r} (overrides are field=value; "
                              f"fields: {', '.join(sorted(fields))})")
        if key not in fields:
            raise ConfigError(f"unknown config field {key!r} (expected field=value; fields: "
                              f"{', '.join(sorted(fields))})")
        if key in seen:
            raise ConfigError(f"override {key!r} is given twice")
        seen.add(key)
        changes[key] = parse_value(getattr(cfg, key), fields[key].type, val, key)
    check_conflicts({**{n: getattr(cfg, n) for n in fields}, **changes}, seen, scale, scale_fields)
    return dataclasses.replace(cfg, **changes) if changes else cfg


def split_spec(arg: str | None, default: str) -> tuple[str, list[str]]:
    """``"small,rounds=3"`` -> ``("small", ["rounds=3"])`` (blank parts ignored)."""
    if arg is not None and not isinstance(arg, str):
        raise ConfigError(f"a config spec is a string scale[,field=value,...], got {arg!r}")
    parts = [p.strip() for p in (arg or default).split(",") if p.strip()]
    if not parts:
        parts = [default]
    if "=" in parts[0]:
        raise ConfigError(f"the spec starts with a scale name, not {parts[0]!r} "
                          f"(scale[,field=value,...], e.g. {default + ',' + parts[0]!r})")
    return parts[0], parts[1:]


def from_scale(base, scales: dict, arg: str, default: str = "small", *, derived: dict | None = None):
    """``base`` at scale ``arg.split(',')[0]`` plus the ``field=value`` overrides after it.
    ``derived``: fields the config sets itself (field -> why), refused as overrides."""
    scale, overrides = split_spec(arg, default)
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(scales)} "
                          "(the spec is scale[,field=value,...])")
    refuse_derived([o.partition("=")[0].strip() for o in overrides], derived)
    return apply_overrides(dataclasses.replace(base, **scales[scale]), overrides, scale=scale,
                           scale_fields=set(scales[scale]))


# --------------------------------------------------------------------------------------------
# Validation (called from each config's __post_init__)
# --------------------------------------------------------------------------------------------

def _type_ok(kind: str, v) -> bool:
    if kind == "bool":
        return isinstance(v, (bool, np.bool_))
    if isinstance(v, (bool, np.bool_)):
        return False
    if kind == "int":
        return isinstance(v, (int, np.integer))
    if kind == "float":
        return isinstance(v, (int, float, np.integer, np.floating)) and not math.isnan(v)
    if kind == "str":
        return isinstance(v, str)
    if kind == "tuple":
        return isinstance(v, tuple)
    return True


_ARTICLE = {"bool": "a bool", "int": "an int", "float": "a number", "str": "a str", "tuple": "a tuple"}


def check_types(cfg) -> None:
    """Every field holds its annotated type (``int`` fields ints, not 2.5; no NaN floats;
    ``None`` only where annotated)."""
    for f in dataclasses.fields(cfg):
        kinds = _kinds(f.type)
        v = getattr(cfg, f.name)
        known = [k for k in (*_SCALARS, "tuple") if k in kinds]
        if not known:
            continue
        if v is None:
            if "None" not in kinds:
                raise ConfigError(f"{f.name} must not be None (type {known[0]})")
            continue
        if not any(_type_ok(k, v) for k in known):
            raise ConfigError(f"{f.name} must be {_ARTICLE[known[0]]}, got {v!r}")


def check_limits(cfg) -> None:
    """Refuse a field of :data:`LIMITS` / :data:`LIMIT_SUFFIXES` above its maximum (tuples: each
    element), a negative seed, an infinite number (every field) and a delta above
    ``fedpriv.dp.accounting.MAX_DELTA`` (:data:`DELTA_FIELDS`)."""
    names = [f.name for f in dataclasses.fields(cfg)]  # declaration order: a stable first error
    for name in names:
        if limit_of(name) is None:
            continue
        (limit, why), v = limit_of(name), getattr(cfg, name)
        for x in (v if isinstance(v, tuple) else (v,)):
            if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) \
                    and math.isfinite(x) and x > limit:  # (inf: the finite rule below names it)
                raise ConfigError(f"{name} = {x} exceeds its limit {limit:,} ({why})")
            if "seed" in name and isinstance(x, (int, np.integer)) and not isinstance(x, bool) \
                    and x < 0:
                raise ConfigError(f"{name} must be in [0, {limit:,}], got {x}")
    for name in names:
        v = getattr(cfg, name)
        for x in (v if isinstance(v, tuple) else (v,)):
            if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, (bool, np.bool_)):
                continue
            if math.isinf(x):
                raise ConfigError(f"{name} must be finite, got {x}")
    for name in DELTA_FIELDS:  # the one rule of every entry point (fedpriv.dp.accounting.MAX_DELTA)
        v = getattr(cfg, name) if name in names else None
        if v is not None and not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)):
            try:
                check_delta(v)
            except ValueError as err:
                raise ConfigError(name + str(err)[len("delta"):]) from None
    if "split" in names and isinstance(cfg.split, tuple) and len(cfg.split) != 3:
        raise ConfigError(f"split must have 3 parts, train/validation/test (e.g. 0.8/0.1/0.1), "
                          f"got {len(cfg.split)}: {cfg.split}")
    if "split" in names and isinstance(cfg.split, tuple) and any(
            isinstance(x, (int, float, np.integer, np.floating)) and not x > 0 for x in cfg.split):
        raise ConfigError(f"split: train, validation and test must each be > 0 (each part needs clients), "
                          f"got {'/'.join(f'{x:g}' for x in cfg.split)}")


def check(cfg, *, positive=(), non_negative=(), open_unit=(), choices=None, fractions=()) -> None:
    """Raise :class:`ConfigError` unless ``cfg``'s fields have their types
    (:func:`check_types`) and: ``positive`` fields are ``>= 1`` (ints) / ``> 0`` (floats),
    ``non_negative`` ``>= 0``, ``open_unit`` in ``(0, 1)``, ``choices`` (field -> allowed values)
    hold an allowed value (a tuple of values, or a registry / tuple of registries of
    ``fedpriv.registry``: a registered name or a plugin's ``"<module>:<name>"``), and
    ``fractions`` are non-negative tuples summing to 1 with a positive first entry. ``None``
    passes every range check (fields that allow it mean "off"/"all")."""
    check_types(cfg)
    check_limits(cfg)
    check_conflicts({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, None)
    for name in positive:
        v = getattr(cfg, name)
        if v is not None and not v > 0:
            raise ConfigError(f"{name} must be >= 1, got {v}" if isinstance(v, (int, np.integer))
                              else f"{name} must be > 0, got {v}")
    for name in non_negative:
        v = getattr(cfg, name)
        if v is not None and not v >= 0:
            raise ConfigError(f"{name} must be >= 0, got {v}")
    for name in open_unit:
        v = getattr(cfg, name)
        if v is not None and not 0 < v < 1:
            raise ConfigError(f"{name} must be in (0, 1), got {v}")
    for name, allowed in (choices or {}).items():
        v = getattr(cfg, name)
        if not _allowed(v, allowed):
            raise ConfigError(f"{name} must be one of {_choice_names(allowed)}, got {v!r}")
    for name in fractions:
        fr = getattr(cfg, name)
        total = float(sum(fr)) if fr else 0.0
        if (len(fr) < 1 or any(not x >= 0 for x in fr) or not math.isclose(total, 1.0, abs_tol=1e-6)):
            raise ConfigError(f"{name} must be fractions that sum to 1, got {fr} (sum {total:g}); "
                              "they are not renormalised")
        if not fr[0] > 0:
            raise ConfigError(f"{name}: the first (training) fraction must be > 0, got {fr}")
    check_signs(cfg)


def check_signs(cfg) -> None:
    """Refuse a negative number in any field (scalars and tuple elements) not in :data:`SIGNED`
    (run last by :func:`check`, after the fields' own, more specific range checks)."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        for x in (v if isinstance(v, tuple) else (v,)):
            if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) \
                    and x < 0 and f.name not in SIGNED:
                raise ConfigError(f"{f.name} must be >= 0, got {x}")


def _registries(allowed) -> tuple:
    """``allowed`` as a tuple of ``fedpriv.registry.Registry`` (empty if it is a plain tuple)."""
    regs = allowed if isinstance(allowed, tuple) else (allowed,)
    return regs if regs and all(isinstance(r, Registry) for r in regs) else ()


def _allowed(value, allowed) -> bool:
    """A choice: a plain tuple of values, or one registry / a tuple of registries (a registered
    name, or a plugin's ``"<module>:<name>"``, which imports the module)."""
    regs = _registries(allowed)
    return any(r.known(value) for r in regs) if regs else value in allowed


def _choice_names(allowed) -> tuple:
    regs = _registries(allowed)
    return tuple(n for r in regs for n in r.names()) if regs else tuple(allowed)


def with_lm_config(cls, scales: dict, lm_scales: dict, arg: str | None, lm_config,
                   default: str = "small", *, derived: dict | None = None):
    """A config ``cls(lm=<LM-FL config>, ...)`` at a scale: overrides naming ``cls``'s own fields
    apply to it, every other override goes to the wrapped LM config (``lm_config(spec)`` at
    ``lm_scales[scale]``); overriding ``lm`` itself is refused, and so is overriding a field of
    ``derived`` (field -> why: set by the experiment itself, e.g. per row)."""
    scale, overrides = split_spec(arg, default)
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(scales)} "
                          "(the spec is scale[,field=value,...])")
    names = [o.partition("=")[0].strip() for o in overrides]
    if "lm" in names:
        raise ConfigError("set the LM fields directly (e.g. rounds=10), not 'lm'")
    refuse_derived(names, derived)
    own_fields = {f.name for f in dataclasses.fields(cls)}
    own = [o for o, n in zip(overrides, names) if n in own_fields]
    lm_scale, scale_overrides = split_spec(lm_scales[scale], default)
    users = [o for o in overrides if o not in own]
    named = {o.partition("=")[0].strip() for o in users}  # the user's value wins over the scale's
    kept = [o for o in scale_overrides if o.partition("=")[0].strip() not in named]
    lm = lm_config(",".join([lm_scale, *kept, *users]))
    return apply_overrides(cls(lm=lm, **scales[scale]), own, scale=scale,
                           scale_fields=set(scales[scale]))


@dataclasses.dataclass(frozen=True)
class PrivateCorpusFields:
    """The private-corpus fields of a config that reads the private users' text without training
    on them federatedly (``configs/wang_figure3.py``; the FL configs have them in
    ``configs.lm_fl.LMFLFields``, with ``split_seed`` in ``configs/public_training.py``): users
    split by client, messages truncated to ``seq_len`` tokens, at most ``max_examples_per_client``
    per user."""
    corpus: str = "chitchat"
    max_clients: int | None = None
    split: tuple = (0.8, 0.1, 0.1)
    split_seed: int = 0
    seq_len: int = 20
    max_examples_per_client: int = 256
    batch_size: int = 16


def check_lanes(value) -> None:
    """``lanes`` (``fedpriv.fl.execution``): "auto", "balanced" or a positive integer."""
    if value in ("auto", "balanced") or (str(value).isdigit() and int(value) >= 1):
        return
    raise ConfigError(f"lanes must be 'auto', 'balanced' or an integer >= 1, got {value!r}")
