"""Shared reporting for experiments and users: run records, Markdown + CSV tables, mean ± std
over seeds, learning curves from ``metrics.jsonl``, line and bar charts (PNG), atomic JSON.

Every experiment writes its artefact through these functions, so tables look the same across
papers: ``write_table(rows, workdir, name)`` -> ``name.csv`` and ``name.md``; ``mean_std`` and
``pm`` format seed statistics; ``metric_curve(workdir, key)`` reads (round, value) pairs that
survive resumes; ``plot_curves`` / ``bar_chart`` draw them (matplotlib, imported on use).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
import subprocess
import time
from typing import Iterable, Sequence

import numpy as np

__all__ = ["run_record", "write_table", "plot_curves", "bar_chart", "save_json", "mean_std", "pm",
           "metric_curve", "Verdict", "ordering_verdict", "write_verdicts", "read_verdicts",
           "VERDICTS_FILE"]


def run_record(config, seed: int) -> dict:
    """What every result carries: config, seed, versions, git commit, time."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - best effort
        commit = ""
    import jax
    return {"config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "seed": seed, "git_commit": commit, "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_table(rows: list[dict], workdir: str, name: str, columns: list[str] | None = None,
                title: str | None = None, notes: list[str] | None = None) -> tuple[str, str]:
    """Write ``rows`` as ``<name>.csv`` and ``<name>.md`` in ``workdir``; returns the paths."""
    os.makedirs(workdir, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    csv_path = os.path.join(workdir, f"{name}.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    md_path = os.path.join(workdir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return csv_path, md_path


def plot_curves(curves: dict[str, tuple[list, list]], path: str, xlabel: str, ylabel: str, title: str = "",
                log: bool = False):
    """Line plot of ``{label: (xs, ys)}`` or ``{label: (xs, ys, yerr)}`` (error bars) to a PNG
    (``log``: logarithmic y axis)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys, *err) in curves.items():
        if err:
            ax.errorbar(xs, ys, yerr=err[0], marker="o", capsize=3, label=label)
        else:
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7 if len(curves) > 6 else None)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_json(obj, path: str):
    """``obj`` as JSON at ``path``, replaced atomically (non-finite floats are written as
    ``Infinity``/``NaN``, which Python's ``json`` reads back)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def mean_std(values: Iterable) -> tuple[float | None, float | None, int]:
    """(mean, sample std (ddof 1; 0 for one value), n) of the non-None, finite values;
    (None, None, 0) if there are none."""
    a = np.array([float(v) for v in values if v is not None and math.isfinite(float(v))], np.float64)
    if not len(a):
        return None, None, 0
    return float(a.mean()), (float(a.std(ddof=1)) if len(a) > 1 else 0.0), len(a)


def pm(values: Iterable, scale: float = 1.0, digits: int = 2) -> str | None:
    """``"m ± s"`` over seeds (just ``"m"`` for one seed; None for none), values times ``scale``."""
    m, s, n = mean_std(values)
    if m is None:
        return None
    return f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}" if n > 1 else f"{scale * m:.{digits}f}"


def metric_curve(workdir: str, key: str, offset: int = 0) -> list[tuple[int, float]]:
    """(round + offset, row[key]) of every row of ``workdir/metrics.jsonl`` that has ``key``
    (one row per round after any resume; a torn last line is dropped)."""
    from fedpriv.fl.loop import read_metrics
    return [(r["round"] + offset, r[key]) for r in read_metrics(workdir) if key in r]


def bar_chart(groups: dict[str, dict[str, tuple[float, float]]], path: str, ylabel: str,
              title: str = "", series: Sequence[str] | None = None, log: bool = False) -> str:
    """Grouped bars with error bars, one panel per key of ``groups``:
    ``{panel title: {x label: {series name: (mean, std)}}}``; ``series`` fixes their order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (panel, bars) in zip(axes[0], groups.items()):
        labels = list(bars)
        names = list(series or dict.fromkeys(s for b in bars.values() for s in b))
        width = 0.8 / max(1, len(names))
        x = np.arange(len(labels))
        for j, s in enumerate(names):
            ms = [bars[l].get(s, (np.nan, 0.0)) for l in labels]
            ax.bar(x + (j - (len(names) - 1) / 2) * width, [m for m, _ in ms], width,
                   yerr=[sd for _, sd in ms], capsize=3, label=s)
        ax.set_xticks(x, labels, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        if len(names) > 1:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# Verdicts: one line per claimed ordering of a paper, read by the results page
# (``python -m experiments.results`` -> experiments/RESULTS.md)
# --------------------------------------------------------------------------------------------

VERDICTS_FILE = "verdicts.json"
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paper's claim and what we measured. ``status``: ``"reproduced"`` / ``"not reproduced"``,
    with ``" (within noise)"`` appended when the measured gap is smaller than its seed spread
    (so the direction is not established either way); ``measured``: the numbers behind it."""

    claim: str
    status: str
    measured: str

    def __post_init__(self):
        if self.status.split(" (")[0] not in (REPRODUCED, NOT_REPRODUCED):
            raise ValueError(f"verdict status must start with {REPRODUCED!r} or {NOT_REPRODUCED!r}, "
                             f"got {self.status!r}")


def ordering_verdict(claim: str, better: Sequence[float], worse: Sequence[float], *,
                     higher_is_better: bool, names: tuple[str, str] = ("A", "B"),
                     digits: int = 3) -> Verdict:
    """Verdict on the claim "``better`` beats ``worse``" from per-seed values of each.

    Reproduced iff the means are ordered as claimed; "(within noise)" when the gap of the means
    is at most ``sqrt(s_a^2 + s_b^2)`` (sample stds over seeds; with one seed each, never).
    """
    ma, sa, na = mean_std(better)
    mb, sb, nb = mean_std(worse)
    if ma is None or mb is None:
        raise ValueError(f"ordering_verdict({claim!r}): no finite values for one side")
    gap = (ma - mb) if higher_is_better else (mb - ma)
    status = REPRODUCED if gap > 0 else NOT_REPRODUCED
    spread = math.hypot(sa, sb)
    if (na > 1 or nb > 1) and abs(gap) <= spread:
        status += " (within noise)"
    f = lambda m, s, n: f"{m:.{digits}g} ± {s:.{digits}g} (n={n})" if n > 1 else f"{m:.{digits}g}"
    measured = f"{names[0]} {f(ma, sa, na)} vs {names[1]} {f(mb, sb, nb)}; gap {gap:+.{digits}g}"
    return Verdict(claim, status, measured)


def write_verdicts(verdicts: Sequence[Verdict], workdir: str) -> str:
    """``workdir/verdicts.json`` (atomic), the file the results page reads."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, VERDICTS_FILE)
    save_json([dataclasses.asdict(v) for v in verdicts], path)
    return path


def read_verdicts(workdir: str) -> list[Verdict]:
    """The verdicts an experiment wrote to ``workdir`` ([] if none)."""
    path = os.path.join(workdir, VERDICTS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [Verdict(**v) for v in json.load(f)]
