"""Config plumbing shared by every ``configs/<experiment>.py`` (docs/design.md §1.6).

``from_scale(base, scales, "small,rounds=60,seeds=0/1")`` = ``base`` with the scale's overrides,
then ``field=value`` overrides parsed by the type of the field (its annotation, else its current
value). Overrides are strict; anything else is refused with :class:`ConfigError` (a one-line
message naming the field) before any data is loaded:

- ``bool``: exactly ``true``/``false``, ``1``/``0``, ``yes``/``no`` (any case); ``on``, ``y``,
  ``ture`` ... are refused, never read as False;
- ``int``: an integer literal (``2.5``, ``1e3`` are refused: ints must be ints);
- ``float``: a number (``inf`` allowed, ``nan`` refused);
- tuples: elements separated by ``/``, each parsed like the tuple's elements;
- ``none``: only for fields annotated ``... | None`` (a ``str`` field takes it as the text);
- every override is ``field=value`` (``rounds`` alone: "needs a value"), each field at most once.

Configs validate their values in ``__post_init__`` with :func:`check` (so ``dataclasses.replace``
is checked too): types, ranges, choices, and fractions that must sum to 1 (never renormalised).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedpriv.data.errors import ConfigError

__all__ = ["ConfigError", "apply_overrides", "check", "check_types", "from_scale", "parse_value",
           "split_spec"]
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
_SCALARS = ("bool", "int", "float", "str")


def _kinds(annotation) -> set[str]:
    """``"int | None"`` -> ``{"int", "None"}`` (also ``Optional[...]`` and real types)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))
    text = text.replace("typing.", "").replace("Optional[", "None | ").replace("]", "")
    return {k.strip() for k in text.split("|") if k.strip()}


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
    if text.strip().lower() == "none":
        if "None" in kinds:
            return None
        if _kind_of(kinds, current) != "str":
            shown = " | ".join(sorted(kinds)) or type(current).__name__
            raise ConfigError(f"override {name!r}: None is not allowed (type {shown})")
        return text
    if "tuple" in kinds or isinstance(current, tuple):
        elem = type(current[0]).__name__ if current else "str"
        if not text.strip():
            return ()
        parts = text.split("/")
        if any(not p.strip() for p in parts):
            raise ConfigError(f"override {name!r}: empty element in {text!r} (tuples are a/b/c)")
        return tuple(_scalar(name, elem if elem in _SCALARS else "str", p) for p in parts)
    return _scalar(name, _kind_of(kinds, current), text)


def apply_overrides(cfg, overrides):
    """``cfg`` with ``["field=value", ...]`` applied; unknown fields, missing values and repeated
    fields are errors (:class:`ConfigError`)."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    seen: set[str] = set()
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
        value = parse_value(getattr(cfg, key), fields[key].type, val, key)
        cfg = dataclasses.replace(cfg, **{key: value})
    return cfg


def split_spec(arg: str | None, default: str) -> tuple[str, list[str]]:
    """``"small,rounds=3"`` -> ``("small", ["rounds=3"])`` (blank parts ignored)."""
    parts = [p.strip() for p in (arg or default).split(",") if p.strip()]
    if not parts:
        parts = [default]
    return parts[0], parts[1:]


def from_scale(base, scales: dict, arg: str, default: str = "small"):
    """``base`` at scale ``arg.split(',')[0]`` plus the ``field=value`` overrides after it."""
    scale, overrides = split_spec(arg, default)
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(scales)} "
                          "(the spec is scale[,field=value,...])")
    return apply_overrides(dataclasses.replace(base, **scales[scale]), overrides)


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


def check(cfg, *, positive=(), non_negative=(), open_unit=(), choices=None, fractions=()) -> None:
    """Raise :class:`ConfigError` unless ``cfg``'s fields have their types
    (:func:`check_types`) and: ``positive`` fields are ``>= 1`` (ints) / ``> 0`` (floats),
    ``non_negative`` ``>= 0``, ``open_unit`` in ``(0, 1)``, ``choices`` (field -> allowed values)
    hold an allowed value, and ``fractions`` are non-negative tuples summing to 1 with a positive
    first entry. ``None`` passes every range check (fields that allow it mean "off"/"all")."""
    check_types(cfg)
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
        if v not in allowed:
            raise ConfigError(f"{name} must be one of {tuple(allowed)}, got {v!r}")
    for name in fractions:
        fr = getattr(cfg, name)
        total = float(sum(fr)) if fr else 0.0
        if (len(fr) < 1 or any(not x >= 0 for x in fr) or not math.isclose(total, 1.0, abs_tol=1e-6)):
            raise ConfigError(f"{name} must be fractions that sum to 1, got {fr} (sum {total:g}); "
                              "they are not renormalised")
        if not fr[0] > 0:
            raise ConfigError(f"{name}: the first (training) fraction must be > 0, got {fr}")


def with_lm_config(cls, scales: dict, lm_scales: dict, arg: str | None, lm_config,
                   default: str = "small"):
    """A config ``cls(lm=<LM-FL config>, ...)`` at a scale: overrides naming ``cls``'s own fields
    apply to it, every other override goes to the wrapped LM config (``lm_config(spec)`` at
    ``lm_scales[scale]``); overriding ``lm`` itself is refused."""
    scale, overrides = split_spec(arg, default)
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(scales)} "
                          "(the spec is scale[,field=value,...])")
    names = [o.partition("=")[0].strip() for o in overrides]
    if "lm" in names:
        raise ConfigError("set the LM fields directly (e.g. rounds=10), not 'lm'")
    own_fields = {f.name for f in dataclasses.fields(cls)}
    own = [o for o, n in zip(overrides, names) if n in own_fields]
    lm_scale, scale_overrides = split_spec(lm_scales[scale], default)
    users = [o for o in overrides if o not in own]
    named = {o.partition("=")[0].strip() for o in users}  # the user's value wins over the scale's
    kept = [o for o in scale_overrides if o.partition("=")[0].strip() not in named]
    lm = lm_config(",".join([lm_scale, *kept, *users]))
    return apply_overrides(cls(lm=lm, **scales[scale]), own)


def check_lanes(value) -> None:
    """``lanes`` (``fedpriv.fl.execution``): "auto", "balanced" or a positive integer."""
    if value in ("auto", "balanced") or (str(value).isdigit() and int(value) >= 1):
        return
    raise ConfigError(f"lanes must be 'auto', 'balanced' or an integer >= 1, got {value!r}")
