"""Runs of one artefact two at a time, one per core, against one after the other (issue 27).

``python -m benchmarks.lanes [--config configs/lm_fl.py:small] [--seeds 0 1] [--out DIR]``

An artefact is many independent runs (seeds, rows, epsilons). On a machine with two cores, two
runs can go one after the other, each free to use both cores (XLA's intra-op threads), or both at
once, each pinned to its own core (``os.sched_setaffinity``, as ``taskset -c N`` does). This
times both on the same runs, in one invocation, in the order: warm-up (not timed, it fills the
data and compile caches), one after the other, both at once, one after the other again (the two
sequential passes bracket the pair, so drift of the machine shows). It also checks that each
seed's final accuracy is the same either way: a run's numbers do not depend on its placement.
A figure, not a test. Writes ``lanes.json`` and ``lanes.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _run(module: str, config: str, seed: int, workdir: str, core: int | None) -> subprocess.Popen:
    """Start ``python -m module --config config,seed=S --workdir W``, pinned to ``core`` if given."""
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    with open(workdir + ".log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", module, "--config", f"{config},seed={seed}",
                                 "--workdir", workdir], stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=pin, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait(procs: list[subprocess.Popen], what: str) -> None:
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"benchmarks.lanes: {what} exited {p.returncode} (log: {p.args[-1]}.log)")


def _accuracy(workdir: str) -> float:
    return json.load(open(os.path.join(workdir, "summary.json")))["test_accuracy"]


def measure(module: str, config: str, seeds: list[int], root: str) -> dict:
    """Wall seconds of the runs of ``seeds`` one after the other (twice) and all at once (one
    core each); the test accuracy of each placement per seed."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < len(seeds):
        raise SystemExit(f"benchmarks.lanes: {len(seeds)} seeds need as many cores, this process has {len(cores)}")
    _wait([_run(module, config, seeds[0], os.path.join(root, "warmup"), None)], "warm-up")
    timings, acc = {}, {}
    for phase in ("sequential", "pair", "sequential_again"):
        t0 = time.perf_counter()
        if phase == "pair":
            _wait([_run(module, config, s, os.path.join(root, f"{phase}{s}"), c) for s, c in zip(seeds, cores)], phase)
        else:
            for s in seeds:
                _wait([_run(module, config, s, os.path.join(root, f"{phase}{s}"), None)], phase)
        timings[phase] = time.perf_counter() - t0
        acc[phase] = {s: _accuracy(os.path.join(root, f"{phase}{s}")) for s in seeds}
    seq = (timings["sequential"] + timings["sequential_again"]) / 2
    return {"module": module, "config": config, "seeds": seeds, "cores": cores, "wall_s": timings,
            "speedup_pair_vs_sequential": seq / timings["pair"],
            "test_accuracy": acc, "same_accuracy": all(acc[p] == acc["sequential"] for p in acc)}


def markdown(r: dict) -> str:
    w = r["wall_s"]
    return "\n".join([
        "# Two runs at once, one per core, vs one after the other", "",
        f"`python -m {r['module']} --config {r['config']},seed=S` for seeds {r['seeds']} on cores {r['cores']}; "
        "warm caches (an untimed warm-up run first)", "",
        "| placement | wall s |", "|---|---|",
        f"| one after the other (each unpinned) | {w['sequential']:.1f} |",
        f"| both at once (one core each) | {w['pair']:.1f} |",
        f"| one after the other, again | {w['sequential_again']:.1f} |", "",
        f"- both at once is **{r['speedup_pair_vs_sequential']:.2f}x** the mean of the two sequential passes",
        f"- test accuracy per seed the same in every placement: {r['same_accuracy']} "
        f"({r['test_accuracy']['sequential']})",
        ""])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default="experiments.lm_fl")
    ap.add_argument("--config", default="configs/lm_fl.py:small")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default="runs/bench/lanes")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="fedpriv-lanes-")
    r = measure(args.module, args.config, args.seeds, root)  # on failure its logs stay in root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    json.dump(r, open(os.path.join(args.out, "lanes.json"), "w"), indent=1)
    open(os.path.join(args.out, "lanes.md"), "w").write(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
