"""Config plumbing shared by every ``configs/<experiment>.py`` (DESIGN.md principle 6).

``from_scale(base, scales, "small,rounds=60,seeds=0/1")`` = ``base`` with the scale's overrides,
then ``field=value`` overrides parsed by the type of the field's current value (or its
annotation when the value is None); tuples are written with ``/``.
"""
from __future__ import annotations

import dataclasses


def _scalar(kind: type, text: str):
    if kind is bool:
        return text.lower() in ("1", "true", "yes")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            return float(text)
    if kind is float:
        return float(text)
    return text


def parse_value(current, annotation: str, text: str):
    """``text`` converted like ``current`` (a field's value) / its ``annotation`` string."""
    if text.lower() == "none":
        return None
    if isinstance(current, tuple) or (current is None and "tuple" in annotation):
        elem = type(current[0]) if current else str
        return tuple(_scalar(elem, t) for t in text.split("/") if t)
    if current is not None:
        return _scalar(type(current), text)
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if name in annotation:
            return _scalar(kind, text)
    return text


def apply_overrides(cfg, overrides):
    """``cfg`` with ``["field=value", ...]`` applied; unknown fields are an error."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for ov in overrides:
        key, sep, val = ov.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"unknown config field {key!r} (expected field=value; fields: {sorted(fields)})")
        annotation = fields[key].type if isinstance(fields[key].type, str) else str(fields[key].type)
        cfg = dataclasses.replace(cfg, **{key: parse_value(getattr(cfg, key), annotation, val)})
    return cfg


def from_scale(base, scales: dict, arg: str, default: str = "small"):
    """``base`` at scale ``arg.split(',')[0]`` plus the ``field=value`` overrides after it."""
    parts = [p for p in (arg or default).split(",") if p]
    scale, overrides = parts[0], parts[1:]
    if scale not in scales:
        raise ValueError(f"unknown scale {scale!r}; choose one of {sorted(scales)}")
    return apply_overrides(dataclasses.replace(base, **scales[scale]), overrides)
