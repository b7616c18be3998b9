"""What regenerating every small-scale artefact costs: wall and CPU seconds per artefact.

``python -m benchmarks.regeneration [--runs runs] [--out DIR]``

Reads each artefact module's record the way the results page does (``runs/<module>/`` if it
finished, else its committed compact summary, `experiments.results`): the wall clock and CPU
seconds (process + children) its last invocation took (``invocation.json``: ``wall_clock_s``,
``cpu_s``, recorded since 2026-11-26; older records say "not recorded") and the commit. A
module that publishes from a committed run store (``reuse_workdir=<store>`` in its config, e.g.
Wang's Tables 2-5 with ``train_missing=False``) trains nothing in that invocation: its runs' cost
is the sum of the stored runs' own ``wall_clock_s`` (one core each; read-backs, ``reused_from``,
not counted), listed apart with their number and the commits they ran at. Sums both. A
figure, not a test: compare two regenerations on the same machine (e.g. before / after an engine
change) with this table. An invocation that resumed from checkpoints or read back a workdir's
finished runs counts only what it ran (not detected here: regenerate from empty workdirs).
"""
from __future__ import annotations

import argparse
import json
import os

from configs.common import split_spec
from experiments import results, runstore
from experiments.index import ARTEFACTS, available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _store(config: str | None) -> str | None:
    """The ``reuse_workdir`` override of a config spec (``file.py:scale,k=v,...``), or None."""
    _, overrides = split_spec((config or "").partition(":")[2], "small")
    return next((v.strip() for k, _, v in (o.partition("=") for o in overrides)
                 if k.strip() == "reuse_workdir" and v.strip()), None)


def stored_runs(store: str, root: str = ROOT) -> dict:
    """``{"n", "wall_s", "commits"}`` of the finished runs under ``store`` (relative to ``root``),
    one per run key (`experiments.runstore.stored`), read-backs (``reused_from``) left out;
    ``wall_s`` sums their ``wall_clock_s`` (None if a run has none)."""
    n, wall, commits = 0, 0.0, set()
    for path in runstore.stored(os.path.join(root, store)).values():
        with open(path) as f:
            s = json.load(f)
        if s.get("reused_from"):
            continue
        n += 1
        commits.add((s.get("git_commit") or "?")[:7])
        wall = None if wall is None or s.get("wall_clock_s") is None else wall + s["wall_clock_s"]
    return {"n": n, "wall_s": wall if n else None, "commits": sorted(commits)}


def rows(runs: str = "runs", summary_dir: str | None = None, root: str = ROOT) -> list[dict]:
    """One row per artefact module: ``module, config, commit, wall_s, cpu_s, source`` and, for a
    module publishing from a run store, ``store`` and ``stored`` (`stored_runs`)."""
    summary_dir = summary_dir or results.SUMMARY_DIR
    out, seen = [], set()
    for a in ARTEFACTS:
        if a.module in seen or not available(a):
            continue
        seen.add(a.module)
        kind, rec, _, _, _ = results._source(a, runs, summary_dir)
        rec = rec or {}
        store = _store(rec.get("config"))
        out.append({"module": a.module, "config": rec.get("config"), "commit": (rec.get("git_commit") or "")[:7],
                    "wall_s": rec.get("wall_clock_s"), "cpu_s": rec.get("cpu_s"), "source": kind or "not run",
                    "store": store, "stored": stored_runs(store, root) if store else None})
    return out


def markdown(table: list[dict]) -> str:
    fmt = lambda x: "not recorded" if x is None else f"{x:,.0f}"
    lines = ["# Regenerating the small-scale artefacts: cost of each one's last invocation", "",
             "| module | config | commit | wall s | CPU s | from | stored runs (commits): their wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in table:
        st = r.get("stored")
        stored = "-" if not st else (f"{st['n']} ({', '.join(st['commits']) or '-'}): {fmt(st['wall_s'])}"
                                     if st["n"] else f"none in `{r['store']}`")
        lines.append(f"| {r['module']} | `{r['config'] or '-'}` | {r['commit'] or '-'} | {fmt(r['wall_s'])} | "
                     f"{fmt(r['cpu_s'])} | {r['source']} | {stored} |")
    rec = [r for r in table if r["wall_s"] is not None]
    stores = {r["store"]: r["stored"] for r in table if r.get("stored") and r["stored"]["wall_s"] is not None}
    store_s = sum(st["wall_s"] for st in stores.values())
    lines += ["", f"- recorded: {len(rec)} of {len(table)} modules; total wall {sum(r['wall_s'] for r in rec):,.0f} s, "
              f"CPU {sum(r['cpu_s'] or 0 for r in rec):,.0f} s of the invocations themselves",
              f"- stored runs the store-published modules read ({len(stores)} store(s), each counted once): "
              f"{sum(st['n'] for st in stores.values())} runs, {store_s:,.0f} s of one-core wall clock",
              "- an invocation that resumed or read back a workdir's runs counts only what it ran"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--out", default=None, help="also write regeneration.md here")
    args = ap.parse_args(argv)
    md = markdown(rows(args.runs))
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "regeneration.md"), "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
