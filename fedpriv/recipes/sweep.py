"""Recipe: one sweep mechanism for every grid of config overrides (ablations, App. C tuning).

A *grid* maps config fields to value lists; its points are their product (``mode="product"``)
or the lists zipped (``mode="zip"``, equal lengths). Each point is ``dataclasses.replace(cfg,
**point)`` of a frozen config (so the config's own validation runs on it), run by ``fn(point_cfg,
point_workdir)`` in its own directory ``workdir/<field=value,...>``. ``fn`` returns a dict (one
row) or a list of dicts (several rows, e.g. one per seed); each row is stored with the point's
values. A point whose ``sweep_point.json`` exists is read back, never retrained, so an
interrupted sweep resumes at the first unfinished point (and ``fn`` itself may resume inside
it)::

    from fedpriv.recipes import sweep
    rows = sweep.run_sweep(lambda c, wd: [run(c, wd)], cfg,
                           {"server_lr": (0.5, 1.0), "client_lr": (0.1, 0.5)}, "runs/tune")
    best = sweep.pick_best(rows, "val_accuracy", keys=("server_lr", "client_lr"))

`pick_best` selects on *validation* metrics only: a test metric name is refused (choosing
hyper-parameters on the test split would leak it into the reported number).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

from fedpriv.report import save_json

POINT_FILE = "sweep_point.json"
MODES = ("product", "zip")


def grid_points(cfg, grid: Mapping[str, Sequence], mode: str = "product") -> list[dict]:
    """The points of `grid` (field -> values) as dicts, in order; fields must be fields of
    `cfg`, each with at least one value (``zip``: all of the same length)."""
    if mode not in MODES:
        raise ValueError(f"sweep mode must be one of {MODES}, got {mode!r}")
    fields = {f.name for f in dataclasses.fields(cfg)}
    if not grid:
        return [{}]
    for name, values in grid.items():
        if name not in fields:
            raise ValueError(f"sweep field {name!r} is not a field of {type(cfg).__name__}")
        if isinstance(values, (str, bytes)) or not len(values):
            raise ValueError(f"sweep field {name!r} needs a non-empty sequence of values, "
                             f"got {values!r}")
    names = list(grid)
    if mode == "zip":
        lengths = {len(v) for v in grid.values()}
        if len(lengths) != 1:
            raise ValueError(f"zipped sweep needs equal-length value lists, got "
                             f"{ {n: len(v) for n, v in grid.items()} }")
        combos = zip(*(grid[n] for n in names))
    else:
        combos = itertools.product(*(grid[n] for n in names))
    return [dict(zip(names, c)) for c in combos]


def point_name(point: Mapping[str, Any]) -> str:
    """A directory name for a point: ``field=value,...`` (``_`` for other characters)."""
    if not point:
        return "point"
    text = ",".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
                    for k, v in point.items())
    return re.sub(r"[^A-Za-z0-9_.,=/+-]", "_", text).replace("/", "+")


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def run_sweep(fn: Callable[[Any, str], Mapping | Sequence[Mapping]], cfg,
              grid: Mapping[str, Sequence], workdir: str, *, mode: str = "product",
              fingerprint: Mapping | None = None, extendable: Sequence[str] = (),
              log: Callable[[str], None] = print) -> list[dict]:
    """Run ``fn(point_cfg, point_workdir)`` at every point of `grid` over `cfg`; returns the rows
    (``{**point, **row}`` for every row ``fn`` returned), in point order.

    A finished point (its ``sweep_point.json`` written after ``fn`` returned) is read back. Its
    identity is the point's config plus `fingerprint` (what ``fn`` reads from outside the
    config, e.g. the seeds it loops over). If a stored point differs only in `extendable` fields
    (e.g. more seeds), ``fn`` runs again on it (``fn`` resumes what it finished); any other
    difference is a ``ValueError`` naming the fields (use another workdir rather than mixing two
    configs in one table).
    """
    rows = []
    points = grid_points(cfg, grid, mode)
    for i, point in enumerate(points):
        pcfg = dataclasses.replace(cfg, **point)
        pdir = os.path.join(workdir, point_name(point))
        done = os.path.join(pdir, POINT_FILE)
        config = _jsonable({**dataclasses.asdict(pcfg), **dict(fingerprint or {})})
        diff = None
        if os.path.exists(done):
            with open(done) as f:
                saved = json.load(f)
            old = saved.get("config", {})
            # a field added to the config since, at its default, keeps the old behaviour
            new_at_default = {f.name for f in dataclasses.fields(pcfg) if f.name not in old
                              and config.get(f.name) == _jsonable({"v": f.default}).get("v")}
            diff = sorted(k for k in set(config) | set(old)
                          if config.get(k) != old.get(k) and k not in new_at_default)
            if set(diff) - set(extendable):
                raise ValueError(f"{pdir} holds a finished point of another config (fields "
                                 f"{diff} differ): use another --workdir")
        if diff == []:
            log(f"sweep point {i + 1}/{len(points)} {point_name(point)}: done before, read back")
            out = saved["rows"]
        else:
            if diff:
                log(f"sweep point {i + 1}/{len(points)}: {diff} extended, resuming the point")
            log(f"sweep point {i + 1}/{len(points)} {point_name(point)}")
            os.makedirs(pdir, exist_ok=True)
            res = fn(pcfg, pdir)
            out = _jsonable([res] if isinstance(res, Mapping) else list(res))
            save_json({"point": _jsonable(point), "config": config, "rows": out}, done)
        pt = _jsonable(point)
        rows.extend({**r, **pt} for r in out)
    return rows


def _is_test_metric(metric: str) -> bool:
    return bool(re.search(r"(^|[^a-z])test", metric.lower()))


def pick_best(rows: Sequence[Mapping], metric: str, higher_is_better: bool = True, *,
              keys: Sequence[str] | None = None) -> dict:
    """The best row by the *validation* `metric` (a name containing "val"; a test metric is
    refused with ``ValueError``). With `keys`, rows sharing those keys' values (e.g. the seeds
    of one grid point) are averaged first; the result is ``{**keys, metric: mean, "n": n}``.
    Rows without a finite value are ignored; ties go to the first point."""
    if _is_test_metric(metric) or "val" not in metric.lower():
        raise ValueError(f"pick_best selects on validation metrics only, got {metric!r} "
                         "(selecting on test data would leak it into the reported result)")
    groups: dict = {}
    for r in rows:
        v = r.get(metric)
        if v is None or not math.isfinite(float(v)):
            continue
        k = tuple(_jsonable(r.get(x)) if isinstance(r.get(x), (list, tuple)) else r.get(x)
                  for x in keys) if keys else len(groups)
        k = json.dumps(k, default=str)
        groups.setdefault(k, {"row": r, "values": []})["values"].append(float(v))
    if not groups:
        raise ValueError(f"no row has a finite {metric!r}")
    best = None
    for g in groups.values():
        m = sum(g["values"]) / len(g["values"])
        if best is None or (m > best[0] if higher_is_better else m < best[0]):
            best = (m, g)
    m, g = best
    if keys:
        return {**{x: g["row"].get(x) for x in keys}, metric: m, "n": len(g["values"])}
    return dict(g["row"])
