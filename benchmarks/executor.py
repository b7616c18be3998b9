"""The run executor, measured and checked (issue 51): an artefact's runs one at a time vs in
pinned workers, and every sliced experiment's numbers for any worker count.

``python -m benchmarks.executor speed [--artefacts A ...] [--out DIR]``
    For each artefact command (default: a representative subset of the small-scale
    regeneration), from empty work directories, back to back: ``--workers 0`` (every run in one
    process, one after the other, free to use every core: how the experiments ran before the
    executor) then ``--workers auto`` (one pinned worker per core). Wall and CPU seconds
    (process + children) of each, the ratio, and whether the two give the same table up to float
    order. Writes ``executor_speed.{json,md}``. A figure, not a test: run it on a quiet machine.

``python -m benchmarks.executor check [--experiments M ...] [--out DIR]``
    Every experiment that declares slices, at its smoke scale (with two seeds / points where the
    smoke has one), three times: ``--workers 0``, ``--workers 1``, ``--workers 2``. Passes when
    the runs of 1 and 2 workers are identical (every number of every run summary under the
    workdir) and the in-process runs agree with them to rtol 1e-4 (XLA's thread count moves the
    last digits only). Writes ``executor_check.{json,md}``.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

# artefact -> command (module, config spec); the speed subset: ~30 min one at a time on 2 cores
SPEED = {
    "mf-comparison": ("mf_comparison", "configs/mf_comparison.py:small"),
    "ddg-comparison": ("ddg_comparison", "configs/ddg_comparison.py:small"),
}
# experiment -> smoke spec with at least two slices (the tests cover mf_comparison)
CHECK = {
    "privacy_utility": "configs/privacy_utility.py:smoke,seeds=0/1",
    "public_training": "configs/public_training.py:smoke,seeds=0/1",
    "wang_ablations": "configs/wang_ablations.py:smoke,seeds=0/1",
    "lm_sweep": "configs/lm_sweep.py:smoke",
    "ddg_comparison": "configs/ddg_comparison.py:smoke",
    "population_expansion": "configs/population_expansion.py:smoke,seeds=0/1",
    "iw_regime": "configs/iw_regime.py:smoke,train=true",
    "pre_text": "configs/pre_text.py:smoke",
    "wang_figure3": "configs/wang_figure3.py:smoke,seeds=0/1",
    "fred_pipeline": "configs/fred_pipeline.py:smoke,seeds=0/1",
}
SKIP = {"wall_clock_s", "s_per_round", "seconds", "time", "git_commit", "git_commit_full", "git_dirty",
        "git_dirty_paths", "reused_from", "wall_s", "phase_seconds", "cpu_s", "started", "finished",
        "embedder_sentences_per_s", "tokens_per_s", "timings", "teacher", "schemes_wall_clock_s",
        # text and bookkeeping: the notes' "Regenerate:" lines name each workdir; "skipped" says
        # whether a run was read back (a worker's runs are, when the parent assembles the tables)
        "notes", "skipped",
        # the invocation's config as a run records it: a slice records its own (one seed, one
        # epsilon, one arm); what a run computed is checked by its numbers and its run key
        "config"}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(module: str, spec: str, workdir: str, workers: str) -> dict:
    """One invocation: ``python -m experiments.<module>`` with ``--workers``; wall and CPU s."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", f"experiments.{module}", "--config", spec, "--workdir", workdir,
                           "--workers", workers, "--no-publish"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = {"wall_s": time.perf_counter() - t0, "cpu_s": _children_cpu() - cpu0, "rc": proc.returncode}
    if proc.returncode:
        out["tail"] = proc.stdout.decode("utf-8", "replace")[-2000:]
    return out


def _numbers(obj, prefix: str = "") -> dict:
    """Every number (and string) of a JSON value, by path, leaving timings and git state out."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k not in SKIP:
                out.update(_numbers(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.update(_numbers(v, f"{prefix}[{i}]"))
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        out[prefix] = obj
    return out


def run_numbers(workdir: str) -> dict:
    """{summary file (relative): its numbers} of every run summary below the top level; where an
    experiment writes none there (its slices keep other files, e.g. wang_figure3's samples), the
    numbers (not strings: they name the workdir) of its top-level ``summary.json``."""
    out = {}
    for path in glob.glob(os.path.join(workdir, "**", "summary.json"), recursive=True):
        rel = os.path.relpath(path, workdir)
        if rel != "summary.json" and not rel.startswith("_executor"):
            out[rel] = _numbers(json.load(open(path)))
    top = os.path.join(workdir, "summary.json")
    if not out and os.path.exists(top):
        out["summary.json"] = {k: v for k, v in _numbers(json.load(open(top))).items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def _close(a, b, rtol: float) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=1e-9)
    return a == b


def compare(a: dict, b: dict, rtol: float = 0.0) -> list[str]:
    """The differences between two :func:`run_numbers` (file/path: a vs b), at most 10."""
    diffs = [f"{f}: only on one side" for f in sorted(set(a) ^ set(b))]
    for f in sorted(set(a) & set(b)):
        for k in sorted(set(a[f]) | set(b[f])):
            if not _close(a[f].get(k), b[f].get(k), rtol):
                diffs.append(f"{f} {k}: {a[f].get(k)!r} vs {b[f].get(k)!r}")
    return diffs[:10]


def check(experiments, out_dir: str) -> list[dict]:
    rows = []
    for module in experiments:
        spec = CHECK[module]
        root = tempfile.mkdtemp(prefix=f"executor-check-{module}-")
        res = {w: _run(module, spec, os.path.join(root, f"w{w}"), w) for w in ("0", "1", "2")}
        failed = {w: r["tail"] for w, r in res.items() if r["rc"]}
        if failed:
            rows.append({"experiment": module, "config": spec, "ok": False, "error": failed})
        else:
            nums = {w: run_numbers(os.path.join(root, f"w{w}")) for w in res}
            exact, close = compare(nums["1"], nums["2"]), compare(nums["0"], nums["1"], rtol=1e-4)
            rows.append({"experiment": module, "config": spec, "runs": len(nums["1"]),
                         "tasks": len(os.listdir(os.path.join(root, "w2", "_executor")))
                         if os.path.isdir(os.path.join(root, "w2", "_executor")) else 0,
                         "workers 1 = 2 (bit for bit)": not exact, "in-process within 1e-4": not close,
                         "ok": not exact and not close, "differences": exact + close,
                         "wall_s": {w: round(r["wall_s"], 1) for w, r in res.items()}})
        print(json.dumps(rows[-1])[:400], flush=True)
        shutil.rmtree(root, ignore_errors=True)
    _write(rows, out_dir, "executor_check", "Executor check: each experiment's runs, any worker count")
    return rows


def speed(artefacts, out_dir: str) -> list[dict]:
    rows = []
    for name in artefacts:
        module, spec = SPEED[name]
        root = tempfile.mkdtemp(prefix=f"executor-speed-{module}-")
        seq = _run(module, spec, os.path.join(root, "sequential"), "0")
        par = _run(module, spec, os.path.join(root, "workers"), "auto")
        same = compare(run_numbers(os.path.join(root, "sequential")), run_numbers(os.path.join(root, "workers")),
                       rtol=1e-4) if not (seq["rc"] or par["rc"]) else ["a run failed"]
        rows.append({"artefact": name, "config": spec, "one at a time: wall s": round(seq["wall_s"]),
                     "one at a time: CPU s": round(seq["cpu_s"]), "workers auto: wall s": round(par["wall_s"]),
                     "workers auto: CPU s": round(par["cpu_s"]),
                     "wall ratio": round(seq["wall_s"] / par["wall_s"], 2),
                     "CPU ratio (workers / one)": round(par["cpu_s"] / max(seq["cpu_s"], 1e-9), 2),
                     "same numbers (rtol 1e-4)": not same, "differences": same})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    if rows:
        tw = sum(r["one at a time: wall s"] for r in rows), sum(r["workers auto: wall s"] for r in rows)
        tc = sum(r["one at a time: CPU s"] for r in rows), sum(r["workers auto: CPU s"] for r in rows)
        rows.append({"artefact": "total", "config": "", "one at a time: wall s": tw[0], "one at a time: CPU s": tc[0],
                     "workers auto: wall s": tw[1], "workers auto: CPU s": tc[1],
                     "wall ratio": round(tw[0] / tw[1], 2), "CPU ratio (workers / one)": round(tc[1] / tc[0], 2)})
    _write(rows, out_dir, "executor_speed", f"Executor: one run at a time vs --workers auto ({os.cpu_count()} cores)")
    return rows


def _write(rows, out_dir, name, title) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"rows": rows, "cores": len(os.sched_getaffinity(0)), "command": " ".join(sys.argv)}, f, indent=1)
    cols = [c for c in rows[0] if c not in ("differences", "error")] if rows else []
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(f"# {title}\n\n`python -m benchmarks.executor {' '.join(sys.argv[1:])}`\n\n")
        f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("speed", "check"))
    ap.add_argument("--artefacts", nargs="*", default=list(SPEED), choices=list(SPEED))
    ap.add_argument("--experiments", nargs="*", default=list(CHECK), choices=list(CHECK))
    ap.add_argument("--out", default="benchmarks/results/cpu_2core")
    args = ap.parse_args(argv)
    rows = speed(args.artefacts, args.out) if args.what == "speed" else check(args.experiments, args.out)
    if args.what == "check" and not all(r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
