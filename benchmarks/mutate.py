"""One-line privacy mutations against the tests that should notice them (issue 54, item 2).

    python -m benchmarks.mutate [--list FILE ...] [--only ID ...] [--json OUT] [--md OUT]
                                [--rev REV] [--timeout S] [--notes FILE] [--no-baseline]

Reads mutant lists (default: every ``benchmarks/mutants/*.toml``), each a TOML array of tables::

    [[mutant]]
    id = "ddg-fewer-shares"          # unique across all files
    class = "ddg shares"             # the audit's class it belongs to (issue 54's bullets)
    file = "fedpriv/dp/ddg.py"
    find = "exact source text"       # must occur exactly once in file
    replace = "mutated text"         # a one-line change of the kind a refactor introduces
    tests = ["tests/dp/test_ddg.py"] # pytest arguments: the tests of that module that should kill it
    why = "what the bug would do"

and, for each mutant, writes ``replace`` over the one occurrence of ``find`` in a scratch copy
of the committed tree (``git archive REV``, default HEAD: never the working tree, whose
uncommitted changes are not part of the run), runs ``python -m pytest -x -q -p no:xdist
<tests>`` there (``PYTHONDONTWRITEBYTECODE=1``: no stale bytecode of the unmutated file can be
picked up) with a timeout, and puts the file back. A mutant is

* **killed** if pytest fails (a test fails, or the mutated module no longer imports),
* **timeout** if pytest runs past ``--timeout`` (counted as killed, listed apart),
* **survived** if the tests pass,
* **invalid** if its entry is malformed, its id is not unique, its ``find`` does not occur
  exactly once in the file (or ``replace`` equals it), its tests collect nothing, or the
  unmutated tests already fail or time out (each distinct test selection is run once,
  unmutated, first; ``--no-baseline`` skips that).

The kill rate is (killed + timeout) / (killed + timeout + survived). The report (``--md``,
``--json``) lists every mutant with its status, the first failing test, and the CPU seconds of
its pytest run (children's user + system time: wall time on a shared machine says little);
``--notes`` (a TOML table ``[notes]`` of id -> text) adds an explanation to a mutant's row,
e.g. why a survivor survives. It is a script, not a test: one run of a list costs about the
sum of its mutants' test files' run times (stopped at the first failure).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LISTS = os.path.join("benchmarks", "mutants", "*.toml")
FIELDS = ("id", "class", "file", "find", "replace", "tests", "why")


@dataclasses.dataclass
class Mutant:
    id: str
    cls: str
    file: str
    find: str
    replace: str
    tests: list
    why: str
    source: str                      # the list it came from
    problem: str = ""                # why it is invalid ("" if it is not)


@dataclasses.dataclass
class Outcome:
    id: str
    status: str                      # killed | timeout | survived | invalid
    detail: str = ""                 # the first failing test, or why invalid
    cpu_s: float = 0.0
    wall_s: float = 0.0


def load_lists(paths) -> list[Mutant]:
    """Every ``[[mutant]]`` of the TOML files ``paths``; a malformed entry or an id used twice
    (across all files) is kept with its ``problem`` set (reported invalid, never run)."""
    mutants = []
    for path in paths:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        entries = data.get("mutant")
        if not isinstance(entries, list):
            raise ValueError(f"{path}: no [[mutant]] entries")
        for i, e in enumerate(entries):
            missing = [k for k in FIELDS if k not in e]
            bad = [k for k in FIELDS if k in e and k != "tests" and not isinstance(e[k], str)]
            tests = e.get("tests")
            problem = ""
            if missing:
                problem = f"missing field(s) {', '.join(missing)}"
            elif bad:
                problem = f"field(s) {', '.join(bad)} must be strings"
            elif not (isinstance(tests, list) and tests and all(isinstance(t, str) and t for t in tests)):
                problem = "tests must be a non-empty list of strings"
            elif not e["id"]:
                problem = "empty id"
            mutants.append(Mutant(str(e.get("id", f"{os.path.basename(path)}#{i}")), str(e.get("class", "")),
                                  str(e.get("file", "")), e.get("find", ""), e.get("replace", ""),
                                  list(tests) if isinstance(tests, list) else [], str(e.get("why", "")),
                                  os.path.relpath(path, ROOT), problem))
    seen: dict[str, int] = {}
    for m in mutants:
        seen[m.id] = seen.get(m.id, 0) + 1
    for m in mutants:
        if seen[m.id] > 1 and not m.problem:
            m.problem = f"id {m.id!r} is used {seen[m.id]} times"
    return mutants


def check_applies(m: Mutant, tree: str) -> str:
    """Why ``m`` cannot be applied to the tree at ``tree`` ("" if it can)."""
    if m.problem:
        return m.problem
    path = os.path.join(tree, m.file)
    if os.path.isabs(m.file) or ".." in m.file.split("/") or not os.path.isfile(path):
        return f"file {m.file!r} is not in the tree"
    with open(path, encoding="utf-8") as f:
        n = f.read().count(m.find)
    if not m.find or n != 1:
        return f"find occurs {n} times in {m.file} (must be exactly once)"
    if m.replace == m.find:
        return "replace equals find"
    return ""


def apply(m: Mutant, tree: str) -> str:
    """Write the mutation into the tree; returns the original text (for ``restore``)."""
    path = os.path.join(tree, m.file)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(m.find, m.replace, 1))
    return text


def restore(m: Mutant, tree: str, text: str) -> None:
    with open(os.path.join(tree, m.file), "w", encoding="utf-8") as f:
        f.write(text)


def scratch_copy(repo: str, rev: str, dest: str) -> str:
    """The committed tree of ``repo`` at ``rev`` extracted into ``dest`` (``git archive``);
    returns the commit's short hash."""
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", rev],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return subprocess.run(["git", "-C", repo, "rev-parse", "--short", rev], capture_output=True,
                          text=True, check=True).stdout.strip()


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)


def run_pytest(tree: str, tests, timeout: float, python: str) -> tuple[str, str, float, float]:
    """``(status, detail, cpu_s, wall_s)`` of ``pytest -x`` on ``tests`` in ``tree``: "passed",
    "failed" (detail: the first failing test or the error's last line), "timeout" or "empty"
    (nothing collected)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = "timeout"
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if status == "timeout":
        return status, f"pytest ran past {timeout:g} s", cpu, wall
    if proc.returncode == 0:
        return "passed", "", cpu, wall
    if proc.returncode == 5:
        return "empty", "no tests collected", cpu, wall
    hit = _FAILED.search(out or "")
    lines = [ln for ln in (out or "").splitlines() if ln.strip()]
    return "failed", hit.group(2) if hit else (lines[-1] if lines else f"exit {proc.returncode}"), cpu, wall


def run(mutants: list[Mutant], rev: str = "HEAD", timeout: float = 900.0, baseline: bool = True,
        python: str = sys.executable, log=print, repo: str = ROOT) -> tuple[list[Outcome], dict]:
    """Apply and test every mutant in a scratch copy of ``repo`` at ``rev`` (the repository's
    files are never touched); ``(outcomes, meta)``, one outcome per mutant, in order."""
    tree = tempfile.mkdtemp(prefix="fedpriv-mutate-")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a terminated run removes its scratch copy
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    outcomes: dict[str, Outcome] = {}
    base: dict[tuple, tuple] = {}
    t_start = time.monotonic()
    try:
        commit = scratch_copy(repo, rev, tree)
        todo = []
        for m in mutants:
            problem = check_applies(m, tree)
            if problem:
                outcomes[id(m)] = Outcome(m.id, "invalid", problem)
            else:
                todo.append(m)
        if baseline:
            for sel in dict.fromkeys(tuple(m.tests) for m in todo):
                status, detail, cpu, wall = run_pytest(tree, sel, timeout, python)
                base[sel] = (status, detail, cpu)
                log(f"baseline {' '.join(sel)}: {status} ({cpu:.0f} CPU s) {detail}")
        for i, m in enumerate(todo, 1):
            b = base.get(tuple(m.tests))
            if b is not None and b[0] != "passed":
                outcomes[id(m)] = Outcome(m.id, "invalid", f"unmutated tests {b[0]}: {b[1]}")
                continue
            text = apply(m, tree)
            try:
                status, detail, cpu, wall = run_pytest(tree, m.tests, timeout, python)
            finally:
                restore(m, tree, text)
            state = {"failed": "killed", "passed": "survived", "timeout": "timeout",
                     "empty": "invalid"}[status]
            outcomes[id(m)] = Outcome(m.id, state, detail, cpu, wall)
            log(f"[{i}/{len(todo)}] {m.id}: {state} ({cpu:.0f} CPU s) {detail}")
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    meta = {"rev": rev, "commit": commit if "commit" in locals() else None, "timeout_s": timeout,
            "python": python, "baseline": {" ".join(k): {"status": v[0], "detail": v[1], "cpu_s": round(v[2], 1)}
                                           for k, v in base.items()},
            "wall_s": round(time.monotonic() - t_start, 1)}
    return [outcomes[id(m)] for m in mutants], meta


def summary(outcomes: list[Outcome]) -> dict:
    n = {s: sum(o.status == s for o in outcomes) for s in ("killed", "timeout", "survived", "invalid")}
    valid = n["killed"] + n["timeout"] + n["survived"]
    return {**n, "valid": valid, "kill_rate": (n["killed"] + n["timeout"]) / valid if valid else None}


def to_json(mutants, outcomes, meta, notes) -> dict:
    rows = [{"id": m.id, "class": m.cls, "file": m.file, "list": m.source, "tests": m.tests,
             "why": m.why, "status": o.status, "detail": o.detail, "cpu_s": round(o.cpu_s, 1),
             "wall_s": round(o.wall_s, 1), **({"note": notes[m.id]} if m.id in notes else {})}
            for m, o in zip(mutants, outcomes)]
    return {"summary": summary(outcomes), "meta": meta, "mutants": rows}


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(report: dict) -> str:
    s, meta = report["summary"], report["meta"]
    rate = "n/a" if s["kill_rate"] is None else f"{100 * s['kill_rate']:.1f} %"
    lines = [f"# Mutation run: {rate} killed",
             "",
             f"`python -m benchmarks.mutate` at commit {meta['commit']} (the committed tree, in a scratch "
             f"copy): {s['valid']} valid mutants, {s['killed']} killed, {s['timeout']} timed out "
             f"(> {meta['timeout_s']:g} s, counted as killed), {s['survived']} survived, "
             f"{s['invalid']} invalid; kill rate (killed + timeout) / valid = **{rate}**. Each mutant ran "
             f"`pytest -x -q -p no:xdist` on its own tests; CPU seconds are the pytest process's user + "
             f"system time (the machine is shared: wall time says little). Whole run: "
             f"{meta['wall_s']:.0f} s wall.",
             "",
             "| id | class | file | tests | status | first failure / note | CPU s |",
             "|---|---|---|---|---|---|---:|"]
    for r in report["mutants"]:
        detail = r["detail"] + (f" -- {r['note']}" if r.get("note") else "")
        lines.append(f"| {_cell(r['id'])} | {_cell(r['class'])} | `{_cell(r['file'])}` | "
                     f"{_cell(' '.join(r['tests']))} | {r['status']} | {_cell(detail)} | {r['cpu_s']:.0f} |")
    surv = [r for r in report["mutants"] if r["status"] == "survived"]
    if surv:
        lines += ["", "## Survivors", ""]
        for r in surv:
            lines.append(f"- **{r['id']}** ({r['class']}, `{r['file']}`): {r['why']}"
                         + (f" -- *why it survives:* {r['note']}" if r.get("note") else " -- (no note)"))
    bad = [r for r in report["mutants"] if r["status"] == "invalid"]
    if bad:
        lines += ["", "## Invalid", ""] + [f"- **{r['id']}**: {r['detail']}" for r in bad]
    if meta.get("baseline"):
        lines += ["", "## Unmutated test selections", "", "| tests | status | CPU s |", "|---|---|---:|"]
        lines += [f"| {_cell(k)} | {v['status']} | {v['cpu_s']:.0f} |" for k, v in meta["baseline"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", nargs="+", help=f"mutant lists (default {DEFAULT_LISTS})")
    p.add_argument("--only", nargs="+", help="run only these mutant ids")
    p.add_argument("--json", help="write the report as JSON here")
    p.add_argument("--md", help="write the report as Markdown here")
    p.add_argument("--rev", default="HEAD", help="the committed tree to mutate (default HEAD)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    p.add_argument("--notes", help="TOML with a [notes] table: mutant id -> explanation for the report")
    p.add_argument("--no-baseline", action="store_true", help="do not run the unmutated selections first")
    args = p.parse_args(argv)
    paths = args.list or sorted(glob.glob(os.path.join(ROOT, DEFAULT_LISTS)))
    if not paths:
        p.error(f"no mutant lists found ({DEFAULT_LISTS})")
    for path in paths:
        if not os.path.isfile(path):
            p.error(f"--list {path}: not a file")
    try:
        mutants = load_lists(paths)
    except (tomllib.TOMLDecodeError, ValueError) as err:
        p.error(str(err))
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            p.error(f"--only: no mutant {', '.join(unknown)} in {', '.join(paths)}")
        mutants = [m for m in mutants if m.id in set(args.only)]
    notes = {}
    if args.notes:
        with open(args.notes, "rb") as f:
            notes = {str(k): str(v) for k, v in tomllib.load(f).get("notes", {}).items()}
    # the scratch tree is no git checkout: its runs record the mutated commit's state, as a worker of
    # fedpriv.executor does (fedpriv.report.git_state), so tests that check a run's commit still run
    full = subprocess.run(["git", "-C", ROOT, "rev-parse", args.rev], capture_output=True, text=True).stdout.strip()
    os.environ["FEDPRIV_GIT_STATE"] = json.dumps({"git_commit": full[:7], "git_commit_full": full,
                                                  "git_dirty": False, "git_dirty_paths": []})
    outcomes, meta = run(mutants, args.rev, args.timeout, not args.no_baseline)
    report = to_json(mutants, outcomes, meta, notes)
    s = report["summary"]
    rate = "n/a" if s["kill_rate"] is None else f"{100 * s['kill_rate']:.1f} %"
    print(f"{s['valid']} valid: {s['killed']} killed, {s['timeout']} timeout, {s['survived']} survived; "
          f"{s['invalid']} invalid; kill rate {rate}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
