"""Benchmark: where one artefact's wall time goes, before and after, for artefacts whose runs do not
record ``phase_seconds`` (issue 27: "per-phase times before/after for one small artefact of each
paper"; the LM-FL runs record their own phases: ``benchmarks.phases``).

    python -m benchmarks.profile_phases koga-iw-regime hou-table1-fred@d538885 [--scale small]
        [--before-commit 025f75c] [--out benchmarks/results/cpu_2core/profile_phases]

``NAME@COMMIT`` gives one artefact its own before-commit (where ``--before-commit`` cannot run it:
at 025f75c, the parent of issue 27's first change, ``experiments.fred_table`` fails to import;
d538885, eight minutes and two FL-batching commits later, is the first that runs it).

For each artefact, each side (the ``--before-commit`` and HEAD) runs the artefact's own command
(``python -m experiments.<module> --config configs/<config>.py:<scale>``) under ``cProfile`` in a
fresh process, from a detached ``git worktree`` of its commit in a temporary directory (so
whatever a run publishes lands there, and the worktree is removed afterwards), one side after
the other, with the shared corpus and XLA caches of ``~/.cache/fedpriv`` as they are (the
before-commit may predate the persistent XLA cache). Its self time (``tottime``, which sums to
the profile's total) is split into buckets by where it was spent:

* **XLA compile**: jax's ``backend_compile*``;
* **waiting for XLA results**: the host blocked on a device result (``np.asarray`` of a
  ``jax.Array``, ``jax.Array._value``, ``block_until_ready``, ``device_get``; an ``np.asarray``
  of host data is counted here too, normally a small share);
* **JAX / Flax / optax / orbax Python**: tracing, lowering, dispatch, checkpointing;
* **privacy accounting**: dp_accounting and scipy;
* **data, tokenization, model files**: ``fedpriv/data``, sentencepiece, tensorflow-datasets,
  gensim, the GGUF reader and numpy memmaps (the public LLM's weights);
* **fedpriv / experiments Python**: the rest of our own code;
* **other** (numpy, imports, I/O, matplotlib, ...).

A figure, not a test: cProfile's overhead (tens of percent on Python-heavy code) is in the wall
it reports; compare the buckets of the two sides, not their absolute seconds.
"""
from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time

from benchmarks import short_commit, worktree, write_results

WAIT, DATA = "waiting for XLA results", "data, tokenization, model files"
BUCKETS = ("XLA compile", WAIT, "JAX / Flax / optax / orbax Python", "privacy accounting", DATA,
           "fedpriv / experiments Python", "other")
_WAIT = {("array.py", "_value"), ("array.py", "block_until_ready"), ("api.py", "device_get"),
         ("api.py", "_device_get")}


def bucket(filename: str, func: str) -> str:
    """The bucket of one profile entry (``pstats`` key: file, line, function)."""
    f = filename.replace(os.sep, "/")
    base = f.rsplit("/", 1)[-1]
    if "jax/_src/compiler.py" in f and func.startswith("backend_compile"):
        return "XLA compile"
    if ("/jax/" in f and (base, func) in _WAIT) or func == "<built-in method numpy.asarray>":
        return WAIT
    if any(p in f for p in ("/jax/", "/jaxlib/", "/flax/", "/optax/", "/orbax/", "/chex/")):
        return "JAX / Flax / optax / orbax Python"
    if any(p in f for p in ("/dp_accounting/", "/scipy/")):
        return "privacy accounting"
    if any(p in f for p in ("fedpriv/data/", "/sentencepiece/", "/tensorflow_datasets/", "/gensim/", "/gguf/",
                            "numpy/_core/memmap.py")):
        return DATA
    if "/fedpriv/" in f or "/experiments/" in f or "/configs/" in f:
        return "fedpriv / experiments Python"
    return "other"


def buckets_of(profile: str) -> dict:
    """``{bucket: self seconds}`` of a cProfile output file (they sum to its total time)."""
    out = dict.fromkeys(BUCKETS, 0.0)
    for (filename, _, func), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():
        out[bucket(filename, func)] += tottime
    return out


def run_side(commit: str, module: str, spec: str, tmp: str) -> dict:
    """One profiled run of ``module`` at ``commit`` (a temporary worktree): wall and buckets, or
    the run's last line of stderr as ``error`` when it failed."""
    with worktree(commit, tmp) as tree:
        prof, workdir = os.path.join(tmp, f"{commit}-{module}.prof"), os.path.join(tmp, f"{commit}-{module}")
        cmd = [sys.executable, "-m", "cProfile", "-o", prof, "-m", f"experiments.{module}", "--config", spec,
               "--workdir", workdir]
        t = time.perf_counter()
        done = subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
        if done.returncode:
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return {"commit": commit, "wall_s": wall, "error": last}
        return {"commit": commit, "wall_s": wall, "self_s": buckets_of(prof)}


def markdown(out: dict) -> str:
    lines = ["# Where an artefact's time goes, before / after (issue 27)", "",
             "cProfile self time by bucket (seconds; profiler overhead included); one run per side, "
             f"{out['scale']} scale", ""]
    for art, sides in out["artefacts"].items():
        names = [f"{s['commit']}" for s in sides]
        lines += [f"## {art} (`{out['commands'][art]}`)", "",
                  "| bucket | " + " | ".join(names) + " |", "|---|" + "---|" * len(sides)]
        cell = lambda s, f: "failed" if "error" in s else f(s)
        for b in BUCKETS:
            lines.append(f"| {b} | " + " | ".join(cell(s, lambda s: f"{s['self_s'][b]:.1f}") for s in sides) + " |")
        lines.append("| **total (profile)** | " + " | ".join(
            cell(s, lambda s: f"{sum(s['self_s'].values()):.1f}") for s in sides) + " |")
        lines.append("| process wall | " + " | ".join(f"{s['wall_s']:.1f}" for s in sides) + " |")
        fails = [f"- {s['commit']} failed: {s['error']}" for s in sides if "error" in s]
        lines += [""] + fails + ([""] if fails else [])
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("artefacts", nargs="+", help="names from python -m experiments --list")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--before-commit", default="025f75c")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    from experiments.index import ARTEFACTS
    by_name = {a.name: a for a in ARTEFACTS}
    todo = [(n.partition("@")[0], n.partition("@")[2] or args.before_commit) for n in args.artefacts]
    unknown = [n for n, _ in todo if n not in by_name or by_name[n].module is None]
    if unknown:
        ap.error(f"unknown artefact(s) or no module: {', '.join(unknown)}")
    out = {"scale": args.scale, "artefacts": {}, "commands": {}, "python": sys.version.split()[0],
           "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, before in todo:
            a = by_name[name]
            spec = f"configs/{a.config}.py:{args.scale}"
            out["commands"][name] = f"python -m experiments.{a.module} --config {spec}"
            out["artefacts"][name] = [run_side(short_commit(c), a.module, spec, tmp) for c in (before, "HEAD")]
            md = markdown(out)
            print(md, flush=True)
            if args.out:  # after every artefact: a later failure keeps what was measured
                write_results(out, md, args.out)


if __name__ == "__main__":
    main()
