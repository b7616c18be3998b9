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

from fedpriv.verdicts import Verdict

__all__ = ["run_record", "git_state", "write_table", "plot_curves", "bar_chart", "save_json", "mean_std", "pm",
           "metric_curve", "Verdict", "write_verdicts", "read_verdicts", "verdicts_from_json",
           "VERDICTS_FILE"]


def _git(*args: str, cwd: str | None = None) -> str | None:
    """stdout of ``git args`` (trailing newlines stripped), None if git fails or is absent."""
    try:
        p = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, cwd=cwd)
    except Exception:  # best effort: no git, no repository
        return None
    return p.stdout.rstrip("\n") if p.returncode == 0 else None


_STATE_AT_START: dict = {}


def git_state(cwd: str | None = None, max_paths: int = 50) -> dict:
    """The code a result ran at: ``git_commit`` (short), ``git_commit_full``, ``git_dirty``
    (tracked files modified vs HEAD; None if unknown) and ``git_dirty_paths`` (up to
    ``max_paths`` of them, relative to the repository root). ``cwd`` default: the checkout this
    ``fedpriv`` package is imported from (the library code that ran), read once per process, at
    the first call (``experiments`` makes it at start-up), so a commit made or checked out while
    a run trains does not relabel it. Empty strings / None outside a git checkout."""
    if cwd is None:
        if max_paths not in _STATE_AT_START and os.environ.get("FEDPRIV_GIT_STATE"):
            # a worker of fedpriv.executor: the state its invocation started at
            _STATE_AT_START[max_paths] = json.loads(os.environ["FEDPRIV_GIT_STATE"])
        if max_paths not in _STATE_AT_START:
            _STATE_AT_START[max_paths] = git_state(os.path.dirname(os.path.abspath(__file__)), max_paths)
        return dict(_STATE_AT_START[max_paths], git_dirty_paths=list(_STATE_AT_START[max_paths]["git_dirty_paths"]))
    full = _git("rev-parse", "HEAD", cwd=cwd) or ""
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd) if full else None
    paths = [line[3:].split(" -> ")[-1] for line in (status or "").splitlines() if line.strip()]
    return {"git_commit": full[:7], "git_commit_full": full,
            "git_dirty": None if status is None else bool(paths), "git_dirty_paths": paths[:max_paths]}


def run_record(config, seed: int) -> dict:
    """What every result carries: config, seed, versions, git commit (and whether the tree had
    uncommitted changes: :func:`git_state`), time."""
    import jax
    return {"config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "seed": seed, **git_state(), "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def md_cell(value) -> str:
    """``value`` as one Markdown table cell: a float to 4 significant digits, None empty, and
    text with ``|`` escaped and its line breaks shown as ``⏎`` (raw, either splits the table's
    row: an LLM's samples hold both)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return ""
    text = str(value).replace("|", "\\|")
    lines = text.splitlines()
    return text if lines == [text] else " ⏎ ".join(line.strip() for line in lines)


def write_table(rows: list[dict], workdir: str, name: str, columns: list[str] | None = None,
                title: str | None = None, notes: list[str] | None = None) -> tuple[str, str]:
    """Write ``rows`` as ``<name>.csv`` (values as they are) and ``<name>.md`` (each value and
    column name a :func:`md_cell`) in ``workdir``; returns the paths."""
    os.makedirs(workdir, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    csv_path = os.path.join(workdir, f"{name}.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(map(md_cell, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(md_cell(r.get(c)) for c in columns) + " |" for r in rows]
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
    return save_figure(fig, path)


def save_figure(fig, path: str, title: str = "") -> str:
    """Every figure's last step: optional ``suptitle``, tight layout, a 120-dpi PNG at ``path``,
    the figure closed (no pyplot state left behind). Returns ``path``."""
    import matplotlib.pyplot as plt
    if title:
        fig.suptitle(title)
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
    ``{panel title: {x label: {series name: (mean, std)}}}``; ``series`` fixes their order. A
    mean that is None or not finite (e.g. a perplexity that overflowed: ``mean_std`` of no finite
    value) draws no bar and is marked "n/a" on the axis, so the figure of a finished run is
    always written."""
    def finite(v) -> bool:
        return v is not None and math.isfinite(float(v))
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
            pos = x + (j - (len(names) - 1) / 2) * width
            ax.bar(pos, [float(m) if finite(m) else np.nan for m, _ in ms], width,
                   yerr=[float(sd) if finite(m) and finite(sd) else 0.0 for m, sd in ms], capsize=3, label=s)
            for p, l, (m, _) in zip(pos, labels, ms):
                if s in bars[l] and not finite(m):  # a value that exists but cannot be drawn
                    ax.annotate("n/a", (p, 0.02), xycoords=("data", "axes fraction"), ha="center",
                                va="bottom", fontsize=7, color="gray")
        ax.set_xticks(x, labels, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        if log and any(finite(m) and float(m) > 0 for b in bars.values() for m, _ in b.values()):
            ax.set_yscale("log")  # (a panel with nothing positive to draw stays linear)
        ax.grid(axis="y", alpha=0.3)
        if len(names) > 1:
            ax.legend()
    return save_figure(fig, path, title)


# --------------------------------------------------------------------------------------------
# Verdicts (computed by fedpriv.verdicts), one per claim of a paper, read by the results page
# (``python -m experiments.results`` -> experiments/RESULTS.md)
# --------------------------------------------------------------------------------------------

VERDICTS_FILE = "verdicts.json"


def write_verdicts(verdicts: Sequence[Verdict], workdir: str) -> str:
    """``workdir/verdicts.json`` (atomic), the file the results page reads."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, VERDICTS_FILE)
    save_json([v.to_json() for v in verdicts], path)
    return path


def read_verdicts(workdir: str) -> list[Verdict]:
    """The verdicts an experiment wrote to ``workdir`` ([] if none); one written under the old
    "within noise" rule reads back as :data:`fedpriv.verdicts.LEGACY` (never as reproduced)."""
    path = os.path.join(workdir, VERDICTS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [verdicts_from_json(v) for v in json.load(f)]


def verdicts_from_json(d: dict) -> Verdict:
    """A :class:`Verdict` from its JSON dict (an old-rule status: :func:`fedpriv.verdicts.legacy`)."""
    from fedpriv.verdicts import STATUSES, legacy
    return Verdict(**d) if d.get("status") in STATUSES and "kind" in d else legacy(d)
