"""Benchmark: ``make demo``'s job before and after issue 27's changes, alternating, end to end.

    python -m benchmarks.demo_ab [--pairs 2] [--before-commit SHA] [--out benchmarks/results/cpu_2core/demo_ab]

"Before" is the old default: padded batches and no persistent XLA compilation cache
(``batching=padded``, ``FEDPRIV_XLA_CACHE=off``); "after" is today's default (``batching="auto"``:
packed sentences on the CPU's one lane) with the persistent cache, warm (an untimed "after" run
first fills it). Both read the same prepared corpora (``~/.cache/fedpriv``, filled by that first
run), so data preparation is not part of the difference. Each run is a fresh process
(``python -m experiments.demo --config configs/demo.py:small``) into a fresh workdir; the pairs
alternate so machine load affects both alike. Reported: each run's process wall seconds and
its own phase times (``phase_seconds``: data, training, evaluation), the ratio of the mean walls,
and each run's validation accuracy and loss (the two paths compute the same rounds up to float
order). A figure, not a test. A ``small`` demo run publishes itself
(``experiments/results/summaries/demo.json`` and the demo's figures); the benchmark puts those
files back as they were, so it leaves the checkout unchanged.

``--before-commit SHA``: "before" is that commit's own code instead (a detached ``git worktree``
of it in a temporary directory, removed afterwards, run with this interpreter), e.g. ``025f75c``,
the parent of issue 27's first change: the old-vs-new figure of the issue's acceptance, with
every change made since (not only the two defaults above). Its runs may predate
``phase_seconds`` (then only the wall is shown).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT, short_commit, worktree, write_results

VARIANTS = {
    "before (padded, no XLA cache)": (",batching=padded", {"FEDPRIV_XLA_CACHE": "off"}),
    "after (auto = packed, warm XLA cache)": ("", {}),
}


def run_once(config_suffix: str, env: dict, workdir: str, cwd: str | None = None) -> dict:
    """One ``make demo`` job in a fresh process, run from ``cwd`` (default: this checkout)."""
    cmd = [sys.executable, "-m", "experiments.demo", "--config", f"configs/demo.py:small{config_suffix}",
           "--workdir", workdir]
    t = time.perf_counter()
    subprocess.run(cmd, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - t
    with open(os.path.join(workdir, "summary.json")) as f:
        s = json.load(f)
    return {"wall_s": wall, "phase_seconds": s.get("phase_seconds", {}), "val_accuracy": s["val_accuracy"],
            "val_loss": s["val_loss"], "commit": s.get("git_commit")}


def markdown(out: dict) -> str:
    lines = ["# `make demo` before / after (issue 27)", "",
             f"{out['pairs']} alternating pairs after one untimed warm-up run"
             f"{' per side' if out.get('before_commit') else ''}; fresh process and workdir "
             "each; process wall seconds", "",
             "| variant | run | wall s | data s | training s | evaluation s | val accuracy | val loss |",
             "|---|---|---|---|---|---|---|---|"]
    for name, runs in out["runs"].items():
        for i, r in enumerate(runs):
            ph = {k.split(" ")[0]: f"{v['wall']:.1f}" for k, v in r["phase_seconds"].items()}
            lines.append(f"| {name} | {i} | {r['wall_s']:.1f} | {ph.get('data', '-')} | "
                         f"{ph.get('training', '-')} | {ph.get('evaluation', '-')} | "
                         f"{r['val_accuracy']:.4f} | {r['val_loss']:.4f} |")
    lines += ["", f"- mean wall: before {out['mean_wall_s'][0]:.1f} s, after {out['mean_wall_s'][1]:.1f} s: "
              f"**{out['speedup']:.2f}x**"]
    return "\n".join(lines) + "\n"


def _pairs(pairs: int, variants: dict) -> dict:
    """``variants``: name -> (config suffix, env, cwd); each pair runs them in order."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, (suffix, env, cwd) in variants.items():
            if cwd is not None:  # an old commit: one untimed run of its own
                run_once(suffix, env, os.path.join(tmp, f"warmup-{name[:5]}"), cwd)
        run_once("", {}, os.path.join(tmp, "warmup"))  # fills the corpus and XLA caches
        runs = {name: [] for name in variants}
        for i in range(pairs):
            for name, (suffix, env, cwd) in variants.items():
                runs[name].append(run_once(suffix, env, os.path.join(tmp, f"{i}-{name[:5]}"), cwd))
    return runs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--before-commit", help="'before' = this commit's code (a temporary worktree)")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    pattern = os.path.join(ROOT, "experiments", "results", "demo-*")
    published = [os.path.join(ROOT, "experiments", "results", "summaries", "demo.json"), *glob.glob(pattern)]
    kept = {}
    for p in published:
        if os.path.exists(p):
            with open(p, "rb") as f:
                kept[p] = f.read()
    variants = {name: (suffix, env, None) for name, (suffix, env) in VARIANTS.items()}
    try:
        with contextlib.ExitStack() as stack:  # the before-commit's worktree, removed on the way out
            if args.before_commit:
                sha = short_commit(args.before_commit)
                after = list(VARIANTS)[1]
                variants = {f"before ({sha}, its own defaults)": ("", {}, stack.enter_context(worktree(sha))),
                            after: variants[after]}
            runs = _pairs(args.pairs, variants)
    finally:  # the runs re-published the demo's summary and figures: put them back
        for p in set(published) | set(glob.glob(pattern)):
            if p in kept:
                with open(p, "wb") as f:
                    f.write(kept[p])
            elif os.path.exists(p):
                os.remove(p)
    means = [sum(r["wall_s"] for r in v) / len(v) for v in runs.values()]
    out = {"pairs": args.pairs, "before_commit": args.before_commit,
           "after_commit": short_commit("HEAD"),
           "runs": runs, "mean_wall_s": means, "speedup": means[0] / means[1],
           "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    md = markdown(out)
    print(md)
    if args.out:
        write_results(out, md, args.out)


if __name__ == "__main__":
    main()
