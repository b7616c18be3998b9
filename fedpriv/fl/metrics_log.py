"""The metrics log of a run: ``<workdir>/metrics.jsonl``, one strict-JSON row per round.

``dumps_row`` writes a row (non-finite floats as ``null`` plus a ``"nonfinite"`` record, so
strict readers accept the file and nothing is lost); ``read_metrics`` reads them back (a torn
last line, from a crash mid-write, is dropped). On resume ``reconcile`` keeps exactly one row per
round up to the checkpoint's round and returns the rounds that have none (a deleted or cut log:
those rows cannot be recomputed without replaying the run). Which row keys are DP-covered and
which are ``nonprivate/`` is ``fedpriv.fl.outputs``' business.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

from fedpriv.fl import workdir as wdlock
from fedpriv.fl.checkpoint import CheckpointError
from fedpriv.fl.workdir import WorkdirError

METRICS = "metrics.jsonl"

__all__ = ["METRICS", "NONFINITE", "dumps_row", "read_metrics", "read_rows", "reconcile",
           "append_row"]

NONFINITE = "nonfinite"


def _strict_value(v, path: str, out: dict):
    if isinstance(v, float) and not math.isfinite(v):
        out[path] = repr(v)  # 'nan', 'inf', '-inf'
        return None
    if isinstance(v, list):
        return [_strict_value(x, f"{path}[{i}]", out) for i, x in enumerate(v)]
    return v


def dumps_row(row: Mapping) -> str:
    """One metrics row as a line of strict JSON (RFC 8259: no bare ``NaN``/``Infinity``).

    A non-finite float (a scalar, or an element of a list metric) is written as ``null`` and
    recorded under ``"nonfinite"``: ``{"<key>" | "<key>[i]...": "nan" | "inf" | "-inf"}``, so
    nothing is lost and strict readers (TensorBoard, ``jq``, browsers) accept the file;
    ``read_metrics`` puts the values back.
    """
    bad: dict = {}
    out = {k: _strict_value(v, k, bad) for k, v in row.items()}
    if bad:
        out[NONFINITE] = bad
    return json.dumps(out, allow_nan=False)


def _restore_nonfinite(row):
    """Inverse of ``dumps_row`` on a parsed row (rows of older files, with bare ``NaN``, pass
    through unchanged)."""
    if not isinstance(row, dict) or not isinstance(row.get(NONFINITE), dict):
        return row
    row = dict(row)
    for path, text in row.pop(NONFINITE).items():
        key, _, rest = str(path).partition("[")
        idx = [int(i) for i in rest.rstrip("]").split("][")] if rest else []
        if key not in row:
            continue
        value = float(text)
        if not idx:
            row[key] = value
            continue
        target = row[key]
        for i in idx[:-1]:
            target = target[i]
        target[idx[-1]] = value
    return row


def read_rows(path: str) -> list[dict]:
    """Rows of a metrics log; a torn last line (a crash mid-write) is dropped. Reads both the
    strict format (``dumps_row``) and older files with bare ``NaN``/``Infinity``."""
    if not os.path.exists(path):
        return []
    if os.path.isdir(path):
        raise WorkdirError(f"{path} is a directory, not a metrics log")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(_restore_nonfinite(json.loads(line)))
        except ValueError:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise CheckpointError(f"{path}: line {i + 1} is not JSON (and is not the last line)")
    return rows


def read_metrics(workdir: str) -> list[dict]:
    """The rows of ``workdir``'s ``metrics.jsonl`` (one per round; a torn last line dropped)."""
    return read_rows(os.path.join(workdir, METRICS))


def _ranges(rounds: Sequence[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7, 9, 10] -> [(1, 3), (7, 7), (9, 10)]."""
    out: list[list[int]] = []
    for r in sorted(rounds):
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return [tuple(x) for x in out]


def reconcile(workdir: str, last_round: int) -> list[tuple[int, int]]:
    """Keep exactly one row per round up to the checkpoint's round (rows past it are recomputed
    identically on resume; none survive a fresh start); drop a torn last line. Returns the
    rounds ``<= last_round`` with no row, as ranges ``[(first, last), ...]`` (a deleted or cut
    log: those rows cannot be rebuilt from the checkpoint, which holds the state, not the
    metrics; they would have to be recomputed by replaying the run)."""
    path = os.path.join(workdir, METRICS)
    by_round = {}
    for row in read_rows(path):
        if isinstance(row, dict) and isinstance(row.get("round"), int) and 1 <= row["round"] <= last_round:
            by_round[row["round"]] = row
    if os.path.exists(path):
        try:
            with open(path + ".tmp", "w") as f:
                f.writelines(dumps_row(by_round[r]) + "\n" for r in sorted(by_round))
            os.replace(path + ".tmp", path)
        except OSError as err:
            _remove_quietly(path + ".tmp")
            raise WorkdirError(f"cannot rewrite {path}: {wdlock.describe_os_error(err)}; the log "
                               "is unchanged") from err
    return _ranges(sorted(set(range(1, last_round + 1)) - set(by_round)))


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def append_row(path: str, row: Mapping) -> None:
    try:
        with open(path, "a") as f:
            f.write(dumps_row(row) + "\n")
    except OSError as err:
        raise WorkdirError(f"cannot write {path}: {wdlock.describe_os_error(err)}; the rows and "
                           "checkpoints written so far are kept (resume when there is room)") from err
