"""What regenerating every small-scale artefact costs: wall and CPU seconds per artefact.

``python -m benchmarks.regeneration [--runs runs] [--out DIR]``

Reads each artefact module's record the way the results page does (``runs/<module>/`` if it
finished, else its committed compact summary, `experiments.results`): the wall clock and CPU
seconds (process + children) its last invocation took (``invocation.json``: ``wall_clock_s``,
``cpu_s``, recorded since 2026-11-26; older records say "not recorded"), the commit, and how
many finished runs it read back from earlier invocations instead of training them (their cost
is not in this invocation's figures). Sums the recorded ones. A figure, not a test: compare two
regenerations on the same machine (e.g. before / after an engine change) with this table.
"""
from __future__ import annotations

import argparse
import os

from experiments import results
from experiments.__main__ import ARTEFACTS, available


def rows(runs: str = "runs", summary_dir: str | None = None) -> list[dict]:
    """One row per artefact module: ``module, config, commit, wall_s, cpu_s, source``."""
    summary_dir = summary_dir or results.SUMMARY_DIR
    out, seen = [], set()
    for a in ARTEFACTS:
        if a.module in seen or not available(a):
            continue
        seen.add(a.module)
        kind, rec, _, _, _ = results._source(a, runs, summary_dir)
        rec = rec or {}
        out.append({"module": a.module, "config": rec.get("config"), "commit": (rec.get("git_commit") or "")[:7],
                    "wall_s": rec.get("wall_clock_s"), "cpu_s": rec.get("cpu_s"), "source": kind or "not run"})
    return out


def markdown(table: list[dict]) -> str:
    fmt = lambda x: "not recorded" if x is None else f"{x:,.0f}"  # noqa: E731
    lines = ["# Regenerating the small-scale artefacts: cost of each one's last invocation", "",
             "| module | config | commit | wall s | CPU s | from |", "|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['module']} | `{r['config'] or '-'}` | {r['commit'] or '-'} | {fmt(r['wall_s'])} | "
                     f"{fmt(r['cpu_s'])} | {r['source']} |")
    rec = [r for r in table if r["wall_s"] is not None]
    lines += ["", f"- recorded: {len(rec)} of {len(table)} modules; total wall {sum(r['wall_s'] for r in rec):,.0f} s, "
              f"CPU {sum(r['cpu_s'] or 0 for r in rec):,.0f} s (runs read back from earlier invocations cost "
              "nothing here)"]
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
