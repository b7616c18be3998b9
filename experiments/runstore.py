"""A committed store of finished runs, so that a rerun longer than one session keeps its work.

Wang et al.'s Tables 2-5 at both budgets are ~170 runs of 800 rounds (4-6 min each on one core:
~15 core-hours), more than one session, and a new session may start on a fresh machine with a
fresh work tree, where the workdirs of the last one are gone. A finished run's ``summary.json`` is small (its
``run_key``, the commit it ran at, metrics, curve and ledger report) and is everything the tables
read. ``add`` copies the finished runs of a workdir into ``experiments/results/run_store/<name>/``
(one ``<arch>-eps<eps>-seed<seed>-<row>-<key>/summary.json`` per run); a later session reads them
back by key with the ``reuse_workdir`` override (`fedpriv.recipes.public.run_rows` searches it
recursively; two runs with one key are the same computation), trains only what is missing, and
the results page still dates every run by the commit it ran at (STALE where the code moved)::

    python -m experiments.runstore add runs/public_training --name wang
    python -m experiments.runstore list --name wang
    python -m experiments.public_training \
        --config "configs/public_training.py:small,...,reuse_workdir=experiments/results/run_store/wang"

Refused (one line, exit 2; nothing in the store is changed by a refused call): a run from a
work tree with uncommitted changes to anything but published outputs (``experiments/results/``,
which a ``small`` run writes into its own checkout: the code is still the commit's), a run without a
commit or a key, and a run whose key is stored already with other numbers (the same computation
giving two results: find out why before keeping either). Read-backs (``reused_from``) are copies
of stored or other runs and are not stored again.

A store is brought to newer code by rerunning its runs there and adding them with ``--supersede``
(``add(..., supersede=True)``): a stored run is then replaced by the rerun of its key when the
rerun's commit descends from the stored run's (strictly: the same commit with other numbers is
still refused, as is a rerun at an older or unrelated commit). Every replacement is reported, with
how far its metrics moved (``METRICS``: bit-identical or by how much), and the replaced summary
stays in git's history::

    python -m experiments.runstore add runs/rerun/l177 --name wang2 --supersede

The reruns of a store's older runs must not read those runs back: ``view`` makes a folder of
symbolic links to only the stored runs at ``--since`` or a commit descending from it, for the
rerun's ``reuse_workdir`` (the runs it may read back instead of training)::

    python -m experiments.runstore view runs/fresh --name wang2 --since d763394
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

from fedpriv.data.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "run_store")
#: fields a stored run needs: the key that identifies the computation and the commit it ran at
REQUIRED = ("run_key", "git_commit_full")


#: uncommitted changes that are not code: what a ``small`` run publishes into its checkout
OUTPUT_PREFIX = "experiments/results/"


def _outputs_only(paths) -> bool:
    """Whether a dirty tree's changed files (``git_state``'s list, at most 50 kept: a full list
    may be truncated, so it is not trusted) are all published outputs, not code: the run then
    ran its commit's code."""
    return bool(paths) and len(paths) < 50 and all(str(p).startswith(OUTPUT_PREFIX) for p in paths)


#: the experiments whose runs a store holds (``fedpriv.recipes.public.run_rows``' rows)
RUN_MODULES = ("experiments.public_training", "experiments.wang_ablations")


def _loaded_files(modules=RUN_MODULES) -> set[str]:
    """Repository-relative paths of every module that importing ``modules`` loads (in a fresh
    interpreter: what a run of theirs can execute)."""
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {os.path.relpath(f, ROOT) for f in out.stdout.splitlines() if f.startswith(ROOT)}


def _not_its_code(paths, loaded=None) -> bool:
    """Whether a dirty tree's changed files (a full list: fewer than 50) are all Python files that
    a run of :data:`RUN_MODULES` never imports (today's import graph): the run then executed its
    commit's code, and its numbers are that commit's."""
    if not paths or len(paths) >= 50 or not all(str(p).endswith(".py") for p in paths):
        return False
    loaded = _loaded_files() if loaded is None else loaded
    return not set(paths) & loaded


def _entry_name(s: dict) -> str:
    eps = s.get("target_epsilon")
    return "-".join(str(p) for p in (s.get("arch") or "lstm", f"eps{eps:g}" if eps is not None else "eps-",
                                     f"seed{s.get('seed')}", s.get("row") or "run", s["run_key"]))


def stored(store: str) -> dict[str, str]:
    """``run_key -> path`` of every run in ``store`` (a directory; {} when it does not exist)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(store, "**", "summary.json"), recursive=True)):
        with open(path) as f:
            key = json.load(f).get("run_key")
        if key:
            out[key] = path
    return out


def _canonical(s: dict) -> str:
    return json.dumps(s, sort_keys=True, default=str)


#: the numbers a superseding rerun is compared on (the tables read these)
METRICS = ("val_accuracy", "test_accuracy", "val_loss", "test_loss")


def _descends(old: str, new: str, repo: str) -> bool:
    """Whether commit ``new`` is a strict descendant of ``old`` in ``repo``'s history (False when
    either is unknown there: fail closed)."""
    if not old or not new or old == new:
        return False
    r = subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=repo, capture_output=True)
    return r.returncode == 0


def moved(old: dict, new: dict) -> dict:
    """``{metric: new - old}`` over :data:`METRICS` present in both (0.0 where bit-identical)."""
    return {m: float(new[m]) - float(old[m]) for m in METRICS
            if isinstance(old.get(m), (int, float)) and isinstance(new.get(m), (int, float))}


def add(workdir: str, store: str, supersede: bool = False, repo: str | None = None) -> dict:
    """Copy every finished run of ``workdir`` (a ``summary.json`` with a ``run_key``, searched
    recursively) into ``store``. Returns counts: ``added``, ``already`` (the same run stored),
    ``read_back`` (copies of other runs, skipped), ``not_runs`` (summaries without a key: an
    experiment's own summary, an engine's), ``superseded`` (stored runs replaced by their rerun at a
    descendant commit; only with ``supersede``) and ``moved`` (``{run_key: moved(old, new)}`` of
    those). Checks every run before writing any (all or nothing)."""
    if not os.path.isdir(workdir):
        raise ConfigError(f"workdir {workdir!r} is not a directory")
    repo = repo or ROOT
    have = stored(store)
    todo, counts = {}, {"added": 0, "already": 0, "read_back": 0, "not_runs": 0, "superseded": 0, "moved": {}}
    replace = {}
    for path in sorted(glob.glob(os.path.join(workdir, "**", "summary.json"), recursive=True)):
        with open(path) as f:
            s = json.load(f)
        if not s.get("run_key"):
            counts["not_runs"] += 1
            continue
        if s.get("reused_from"):
            counts["read_back"] += 1
            continue
        missing = [k for k in REQUIRED if not s.get(k)]
        if missing:
            raise ConfigError(f"{path}: no {'/'.join(missing)}: a stored run must name the commit it ran at")
        if s.get("git_dirty") is not False and not _outputs_only(s.get("git_dirty_paths")) \
                and not _not_its_code(s.get("git_dirty_paths")):
            raise ConfigError(f"{path}: ran in a work tree with uncommitted changes "
                              f"({', '.join(s.get('git_dirty_paths') or ['unknown'])}): its code has no commit")
        key = s["run_key"]
        for other in (have.get(key), todo.get(key, (None,))[0]):
            if other is None:
                continue
            with open(other) as f:
                old = json.load(f)
            if _canonical(old) == _canonical(s):
                continue
            if supersede and other == have.get(key) and key not in todo \
                    and _descends(old.get("git_commit_full"), s["git_commit_full"], repo):
                replace[key] = (other, old)
                continue
            why = (f"a rerun supersedes only a run of an older commit it descends from "
                   f"({old.get('git_commit')} -> {s.get('git_commit')})" if supersede else
                   "the same computation gave two results; keep neither until that is explained")
            raise ConfigError(f"run {key} is stored already ({other}) with other numbers than {path}: {why}")
        if key in replace:
            todo[key] = (path, s)
            continue
        if key in have or key in todo:
            counts["already"] += 1
            continue
        todo[key] = (path, s)
    for key, (path, s) in todo.items():
        if key in replace:
            old_path, old = replace[key]
            dest = old_path
            counts["superseded"] += 1
            counts["moved"][key] = moved(old, s)
        else:
            dest = os.path.join(store, _entry_name(s), "summary.json")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest + ".tmp", "w") as f:
            json.dump(s, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
        os.replace(dest + ".tmp", dest)
        if key not in replace:
            counts["added"] += 1
    return counts


def moved_summary(moves: dict) -> str:
    """One line on how far superseded runs moved: per metric, in how many runs it is bit-identical
    and its largest absolute change (accuracies in points)."""
    if not moves:
        return "none superseded"
    parts = []
    for metric in METRICS:
        vals = [abs(m[metric]) for m in moves.values() if metric in m]
        if vals:
            scale, unit = (100.0, " points") if "accuracy" in metric else (1.0, "")
            parts.append(f"{metric} identical in {sum(v == 0.0 for v in vals)}, largest change "
                         f"{scale * max(vals):.3g}{unit}")
    return f"{len(moves)} superseded: " + "; ".join(parts)


def view(out: str, store: str, since: str, repo: str | None = None) -> dict:
    """Make ``out`` (a new folder) hold a symbolic link to every entry of ``store`` whose run's
    commit is ``since`` or descends from it. Returns ``{"linked": n, "left_out": m}``. Refused
    (nothing written) when ``out`` exists or ``since`` is not a commit of ``repo``."""
    repo = repo or ROOT
    full = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{since}^{{commit}}"], cwd=repo,
                          capture_output=True, text=True).stdout.strip()
    if not full:
        raise ConfigError(f"--since {since!r} is not a commit of this repository")
    if os.path.lexists(out):
        raise ConfigError(f"{out!r} exists already: a view is made in a new folder")
    keep, left = [], 0
    for path in stored(store).values():
        with open(path) as f:
            commit = json.load(f).get("git_commit_full")
        if commit == full or _descends(full, commit, repo):
            keep.append(os.path.dirname(os.path.abspath(path)))
        else:
            left += 1
    os.makedirs(out)
    for entry in keep:
        os.symlink(entry, os.path.join(out, os.path.basename(entry)))
    return {"linked": len(keep), "left_out": left}


def listing(store: str) -> list[str]:
    """One line per stored run: arch, epsilon, seed, row, commit, test accuracy."""
    lines = []
    for key, path in sorted(stored(store).items(), key=lambda kv: kv[1]):
        with open(path) as f:
            s = json.load(f)
        acc = s.get("test_accuracy")
        lines.append(f"{os.path.basename(os.path.dirname(path))}  {s.get('git_commit')}  "
                     f"test {'-' if acc is None else f'{100 * acc:.2f} %'}")
    return lines


def main(argv=None) -> None:
    from experiments.common import ArgumentParser  # usage errors in one line, exit 2
    ap = ArgumentParser(prog="python -m experiments.runstore", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("add", "list", "view"))
    ap.add_argument("workdir", nargs="?", help="add: the workdir whose finished runs to store; view: the "
                    "new folder of links")
    ap.add_argument("--name", required=True, help="the store under experiments/results/run_store/ (e.g. wang)")
    ap.add_argument("--supersede", action="store_true",
                    help="add: replace a stored run by its rerun at a commit that descends from the stored one's")
    ap.add_argument("--since", help="view: link the runs at this commit or a descendant of it")
    ap.add_argument("--store", default=STORE, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.name or os.sep in args.name or args.name.startswith("."):
        raise ConfigError(f"--name {args.name!r} must be a plain directory name")
    store = os.path.join(args.store, args.name)
    if args.since and args.command != "view":
        raise ConfigError("--since applies to view only")
    if args.command == "add":
        if not args.workdir:
            raise ConfigError("add needs the workdir whose finished runs to store")
        counts = add(args.workdir, store, supersede=args.supersede)
        print(f"{store}: {counts['added']} added, {counts['already']} stored before, "
              f"{counts['read_back']} read-backs skipped; {len(stored(store))} runs in the store")
        if args.supersede:
            print(moved_summary(counts["moved"]))
    elif args.supersede:
        raise ConfigError("--supersede applies to add only")
    elif args.command == "view":
        if not args.workdir or not args.since:
            raise ConfigError("view needs the new folder and --since COMMIT")
        counts = view(args.workdir, store, args.since)
        print(f"{args.workdir}: {counts['linked']} runs of {store} at {args.since} or later linked, "
              f"{counts['left_out']} older left out")
    else:
        print("\n".join(listing(store)) or f"{store}: no runs")


if __name__ == "__main__":
    from experiments import common
    common.cli(main, sys.argv[1:])
