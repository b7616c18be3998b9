"""Where one artefact's time went: wall and CPU seconds per phase, summed over its training runs.

``python -m benchmarks.phases WORKDIR [WORKDIR ...] [--out FILE]``

Every LM-FL run records ``phase_seconds`` in its ``summary.json`` (``recipes.lm.PhaseTimer``:
data, training (rounds, compiles, checkpoints), evaluation; wall and CPU, this session's only).
This walks each WORKDIR (``experiments.results.run_summaries``: links followed, each real
directory once, as the results page does), sums the phases over the runs it finds, and reads the
experiment invocation's own ``wall_clock_s`` / ``cpu_s`` (``invocation.json`` at the top of
WORKDIR, if any; the publishing invocation of a workdir whose runs trained elsewhere is only the
read-back). A figure, not a test: wall seconds depend on what else the machine ran (compare CPU
seconds across loads), and runs resumed in several sessions record only their last.
"""
from __future__ import annotations

import argparse
import json
import os

from experiments import results


def collect(workdir: str) -> dict:
    """``{"runs": n, "phases": {phase: {"wall": s, "cpu": s}}, "run_wall_s": s, "invocation": {...}}``."""
    phases: dict = {}
    runs, run_wall = 0, 0.0
    for _, s in results.run_summaries(workdir):
        if not isinstance(s.get("phase_seconds"), dict):
            continue
        runs += 1
        run_wall += float(s.get("wall_clock_s") or 0.0)
        for name, t in s["phase_seconds"].items():
            acc = phases.setdefault(name, {"wall": 0.0, "cpu": 0.0})
            acc["wall"] += float(t.get("wall", 0.0))
            acc["cpu"] += float(t.get("cpu", 0.0))
    inv = {}
    path = os.path.join(workdir, "invocation.json")
    if os.path.exists(path):
        with open(path) as f:
            d = json.load(f)
        inv = {k: d.get(k) for k in ("module", "config", "git_commit", "wall_clock_s", "cpu_s")}
    return {"runs": runs, "phases": phases, "run_wall_s": run_wall, "invocation": inv}


def markdown(workdir: str, c: dict) -> str:
    inv = c["invocation"]
    total_w = sum(t["wall"] for t in c["phases"].values())
    total_c = sum(t["cpu"] for t in c["phases"].values())
    lines = [f"## {workdir}", "",
             f"{c['runs']} training runs" + (f" of `{inv.get('module')}` (`{inv.get('config')}`)" if inv else ""), "",
             "| phase | wall s | share of wall | CPU s | share of CPU |", "|---|---|---|---|---|"]
    for name, t in sorted(c["phases"].items(), key=lambda kv: -kv[1]["wall"]):
        lines.append(f"| {name} | {t['wall']:,.0f} | {100 * t['wall'] / total_w if total_w else 0:.1f} % | "
                     f"{t['cpu']:,.0f} | {100 * t['cpu'] / total_c if total_c else 0:.1f} % |")
    lines.append(f"| **sum over runs** | {total_w:,.0f} | | {total_c:,.0f} | |")
    if inv.get("wall_clock_s") is not None:
        lines += ["", f"- the publishing invocation (commit {str(inv.get('git_commit') or '')[:7]}): wall "
                      f"{inv['wall_clock_s']:,.0f} s, CPU {inv.get('cpu_s') or 0:,.0f} s (data, tokenisation, "
                      "read-back of finished runs, tables and figures; runs trained in it are inside)"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdirs", nargs="+")
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    args = ap.parse_args(argv)
    missing = [w for w in args.workdirs if not os.path.isdir(w)]
    if missing:
        ap.error(f"not a directory: {missing[0]}")
    md = "# Per-phase time of artefact runs\n\n" + "\n".join(markdown(w, collect(w)) for w in args.workdirs)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
