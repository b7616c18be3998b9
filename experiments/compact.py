"""Compact summaries of finished runs (``experiments/results.py``'s module docstring, "Compact
summaries"): ``<workdir>/compact.json`` after every successful run (``experiments.common.cli``),
published under ``experiments/results/summaries/<module>.json`` for a ``small`` / ``paper`` run.

A leaf beside the index: ``experiments.common`` (which records a run) and ``experiments.results``
(which builds the page from them) both import it; it imports neither, so recording a run needs no
import of the results page (the circle ``common -> results -> common`` is cut here).
"""
from __future__ import annotations

import json
import os
import shutil

from experiments import index
from fedpriv.errors import ConfigError
from fedpriv.report import read_verdicts, save_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "experiments", "results")
SUMMARY_DIR = os.path.join(RESULTS_DIR, "summaries")
COMPACT_FILE = "compact.json"
COMPACT_FORMAT = 1
PUBLISH_SCALES = ("small", "paper")


def _artefacts_of(module: str) -> list[index.Artefact]:
    name = module.rsplit(".", 1)[-1]
    return [a for a in index.ARTEFACTS if a.module == name]


def _scale(spec: str) -> str:
    return spec.partition(":")[2].split(",")[0]


def run_summaries(workdir: str) -> list[tuple[str, dict]]:
    """``(directory, summary)`` of every readable ``summary.json`` under ``workdir`` (itself
    included), sorted by directory. Runs combined from several workdirs are symlinked in
    (pre_text, public_training): links are followed, and a directory reached twice (or through a
    link cycle) is walked once."""
    found, seen = [], set()
    for root, dirs, files in os.walk(workdir, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []  # an alias of a directory already walked: not again, nor below it
            continue
        seen.add(real)
        if "summary.json" not in files:
            continue
        try:
            with open(os.path.join(root, "summary.json")) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            found.append((root, rec))
    return sorted(found, key=lambda item: item[0])


def trained_commits(workdir: str) -> list[str]:
    """The commits the finished training runs under ``workdir`` recorded (``summary.json`` of
    every sub-directory, e.g. one per seed and row; not the top-level one the invocation writes),
    without repeats, in the order found; ``None`` for a run that recorded no commit (the page then
    marks the artefact STALE: fail closed). An experiment that reads finished runs back writes its
    tables at a later commit than they trained at: the page dates the artefact by these (links
    followed, :func:`run_summaries`: else a combined workdir's commits go unread and the page
    would date it by the invocation that only wrote the tables)."""
    out = []
    for root, rec in run_summaries(workdir):
        if os.path.abspath(root) == os.path.abspath(workdir):
            continue
        c = rec.get("git_commit_full") or rec.get("git_commit") or None
        if c not in out:
            out.append(c)
    return out


def compact_summary(invocation: dict, workdir: str) -> dict:
    """The compact summary of the run in ``workdir`` described by ``invocation`` (see the module
    docstring): no checkpoints, only what the page and the verdicts need; ``trained_at``: the
    commits its training runs recorded (:func:`trained_commits`)."""
    arts = _artefacts_of(invocation["module"])
    outputs = {}
    for a in arts:
        for name in a.outputs:
            path = os.path.join(workdir, name)
            if name.endswith(".md") and os.path.exists(path):
                with open(path) as f:
                    outputs[name] = f.read()
    return {"format": COMPACT_FORMAT, **invocation, "trained_at": trained_commits(workdir),
            "artefacts": [a.name for a in arts],
            "verdicts": [v.to_json() for v in read_verdicts(workdir)], "outputs": outputs,
            "figures": sorted({n for a in arts for n in a.outputs if not n.endswith(".md")
                               and os.path.exists(os.path.join(workdir, n))})}


def record_compact(invocation: dict, workdir: str, summary_dir: str | None = None,
                   results_dir: str | None = None, publish: bool = True) -> dict:
    """Write ``<workdir>/compact.json``; for a ``small`` / ``paper`` run also publish it as
    ``<summary_dir>/<module>.json`` and its figures as ``<results_dir>/<artefact>-<name>``
    (defaults: the repository's ``experiments/results/``), unless ``publish`` is False (the
    CLI's ``--no-publish``). Returns the summary."""
    summary = compact_summary(invocation, workdir)
    save_json(summary, os.path.join(workdir, COMPACT_FILE))
    if publish and _scale(invocation.get("config", "")) in PUBLISH_SCALES and summary["artefacts"]:
        summary_dir = summary_dir or SUMMARY_DIR
        results_dir = results_dir or RESULTS_DIR
        os.makedirs(summary_dir, exist_ok=True)
        save_json(summary, os.path.join(summary_dir, f"{invocation['module'].rsplit('.', 1)[-1]}.json"))
        for a in _artefacts_of(invocation["module"]):
            for name in summary["figures"]:
                if name in a.outputs:
                    shutil.copyfile(os.path.join(workdir, name), os.path.join(results_dir, f"{a.name}-{name}"))
    return summary


def read_compact(path: str) -> dict | None:
    """A compact summary (None if ``path`` does not exist); refuses another format."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        s = json.load(f)
    if s.get("format") != COMPACT_FORMAT:
        raise ConfigError(f"{path}: compact summary format {s.get('format')!r}, expected {COMPACT_FORMAT}")
    return s


