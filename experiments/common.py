"""Shared plumbing for experiment modules: config loading, tables, plots, run records."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import itertools
import os
import resource
import sys
import time
import typing

from fedpriv import executor
from fedpriv.data.errors import ConfigError, FedprivError, MissingResourceError
from fedpriv.dp.ledger import PrivacyBudgetExceeded
from fedpriv.executor.worker import resolve
from fedpriv.fl import workdir as workdir_lock


def load_config(spec: str):
    """``"configs/demo.py:small,rounds=10"`` -> ``get_config("small,rounds=10")`` of that file.

    Raises :class:`ConfigError` (a ``ValueError``) for a spec that is not ``path.py[:arg]``, a
    file that fails to import or has no ``get_config``, and any invalid scale / override;
    :class:`MissingResourceError` (a ``FileNotFoundError``) for a missing file.
    """
    path, _, arg = spec.partition(":")
    if not path:
        raise ConfigError(f"--config {spec!r} names no file (expected path/to/config.py:scale[,field=value,...])")
    if not os.path.exists(path):
        raise MissingResourceError(f"config file {path!r}",
                                   "check the --config path (expected path/to/config.py:scale)")
    if not path.endswith(".py") or not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} is not a Python file (expected "
                          "--config path/to/config.py:scale[,field=value,...])")
    rel = os.path.relpath(os.path.abspath(path))
    try:
        if not rel.startswith("..") and rel.endswith(".py"):  # a module of this repository
            module = importlib.import_module(rel[:-3].replace(os.sep, "."))
        else:
            name = f"_fedpriv_config_{abs(hash(os.path.abspath(path)))}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # dataclasses need their module registered
            module_spec.loader.exec_module(module)
    except (FedprivError, ValueError):
        raise
    except Exception as e:  # a config file is user code: say which file failed
        raise ConfigError(f"cannot load config file {path!r}: {type(e).__name__}: {e}") from e
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"config file {path!r} has no get_config(arg)")
    return module.get_config(arg)


# What an entry point reports as a user error (one line, exit 2) rather than a traceback:
# fedpriv's error classes (bad data, tokenizer, config, clip norm), ValueError (config and
# argument validation), missing files, and the ledger refusing a run over its budget.
USER_ERRORS = (FedprivError, PrivacyBudgetExceeded, ValueError, FileNotFoundError,
               NotADirectoryError, IsADirectoryError, PermissionError)


def is_environment_error(e: BaseException) -> bool:
    """An environment that cannot run fedpriv at all, reported like a user error: a JAX backend
    asked for (``JAX_PLATFORMS=tpu`` without a TPU) that cannot start."""
    return isinstance(e, RuntimeError) and str(e).startswith("Unable to initialize backend")


def cli(main, argv=None) -> None:
    """Run an experiment's ``main(argv)`` as a command: a user error (:data:`USER_ERRORS`) is
    printed as ONE line ``<module>: error: <message>`` on stderr and exits with status 2; nothing
    already written in the work directory is deleted. Other exceptions (genuine bugs) keep their
    traceback. ``FEDPRIV_TRACEBACK=1`` shows the traceback of user errors too.

    Every ``experiments/*.py`` ends with ``if __name__ == "__main__": common.cli(main)``.
    """
    module = sys.modules.get(main.__module__)
    spec = getattr(module, "__spec__", None)
    prog = spec.name if spec is not None and spec.name else main.__module__
    _LAST_RUN.clear()
    clock = (time.perf_counter(), _cpu_seconds())
    try:
        try:
            main(argv)
        except Exception as e:  # noqa: BLE001 - user errors become one line, bugs are re-raised
            if not (isinstance(e, USER_ERRORS) or is_environment_error(e)) or os.environ.get("FEDPRIV_TRACEBACK"):
                raise
            msg = " ".join(str(e).split()) or type(e).__name__
            if is_environment_error(e):
                msg = f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}: {msg}"
            elif not isinstance(e, (FedprivError, PrivacyBudgetExceeded)):
                msg = f"{type(e).__name__}: {msg}"
            print(f"{prog}: error: {msg}", file=sys.stderr)
            sys.exit(2)
        record_invocation(time.perf_counter() - clock[0], _cpu_seconds() - clock[1])
    finally:
        release_workdirs()


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line (exit 2), like :func:`cli`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def config_and_workdir(argv, doc: str, name: str, workdir: str | None = None):
    """Every experiment's command line: ``--config configs/<name>.py:<scale>[,field=value...]``
    (default scale ``small``) and ``--workdir`` (default ``runs/<name>``). Returns
    ``(config, workdir, config spec)``; usage errors are one line (exit 2). ``--no-publish``: a
    ``small`` / ``paper`` run does not publish its compact summary into the repository
    (:func:`record_invocation`)."""
    ap = ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--config", default=f"configs/{name}.py:small",
                    help="path.py:scale[,field=value,...] (scales: smoke, small, paper)")
    ap.add_argument("--workdir", default=workdir or f"runs/{name}")
    ap.add_argument("--no-publish", action="store_true",
                    help="keep the run's compact summary in the work directory: do not publish it "
                         "(or its figures) under experiments/results/ (make demo: the main job leaves "
                         "the checkout as it was)")
    add_executor_arguments(ap)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    check_config_type(cfg, name, args.config)
    execution = executor_options(args)
    hold_workdir(args.workdir)
    _LAST_RUN.update(workdir=args.workdir, config=args.config, module=f"experiments.{name}",
                     publish=not args.no_publish, **execution)
    return cfg, args.workdir, args.config


def add_executor_arguments(ap: argparse.ArgumentParser) -> None:
    """``--workers``, ``--cores-per-worker``, ``--cluster``: how an experiment's independent runs
    are executed (:func:`run_slices`; never part of a run's configuration or key)."""
    ap.add_argument("--workers", default=os.environ.get("FEDPRIV_WORKERS", "auto"),
                    help="worker processes for the independent runs: 'auto' (one per core, or per GPU), "
                         "a number, or 0 (every run in this process, one after the other); default "
                         "$FEDPRIV_WORKERS, else auto")
    ap.add_argument("--cores-per-worker", type=int, default=1,
                    help="CPU cores each worker is pinned to (default 1; the same for any --workers, so "
                         "the numbers do not depend on the worker count)")
    ap.add_argument("--cluster", default=None, metavar="ADDRESS",
                    help="run on a Ray cluster: 'local' (a local Ray instance), 'auto' (the cluster this "
                         "machine belongs to) or ray://HOST:PORT; one run per GPU (or --cores-per-worker CPUs)")


def executor_options(args) -> dict:
    """The parsed executor arguments, checked (one-line errors)."""
    workers = str(args.workers).strip()
    if workers != "0":
        executor.resolve_workers(workers, args.cores_per_worker)  # refuses a bad value now, before any work
    if args.cluster is not None and workers == "0":
        raise ConfigError("--cluster with --workers 0: a cluster runs the runs in its workers; drop one of them")
    return {"workers": workers, "cores_per_worker": args.cores_per_worker, "cluster": args.cluster}


def _part_key(part: dict) -> str:
    """A task key for a slice: ``seeds=0,epsilons=1.77`` (characters a key refuses become ``-``)."""
    text = ",".join(f"{k}={'-'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in part.items())
    return "".join(c if c.isalnum() or c in "._=+,@-" else "-" for c in text)


def _field(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def product(cfg, *fields: str) -> list[dict]:
    """The slices of ``cfg`` along its tuple fields ``fields`` (dotted paths into nested configs
    allowed): one ``{field: value}`` per combination, in the config's order."""
    return [dict(zip(fields, combo)) for combo in itertools.product(*(tuple(_field(cfg, f)) for f in fields))]


def narrowed(cfg, part: dict):
    """``cfg`` with each (dotted) field of ``part`` set to the one-element tuple of its value (the
    config re-validates itself): the default ``narrow`` of :func:`run_slices`."""
    for path, value in part.items():
        head, _, rest = path.partition(".")
        sub = narrowed(getattr(cfg, head), {rest: value}) if rest else (value,)
        cfg = dataclasses.replace(cfg, **{head: sub})
    return cfg


def _qualname(fn) -> str:
    module = sys.modules.get(fn.__module__)
    spec = getattr(module, "__spec__", None)  # under ``python -m``, __module__ is "__main__"
    return f"{spec.name if spec is not None and spec.name else fn.__module__}:{fn.__qualname__}"


def run_slice(train: str, narrow: str, config: str, part: dict, workdir: str) -> None:
    """In a worker of :func:`run_slices`: ``train(narrow(load_config(config), part), workdir)``
    (functions named ``"module:function"``). The invocation that dispatched it holds
    ``workdir``'s lock; each run inside takes its own run directory's lock."""
    cfg = resolve(narrow)(load_config(config), part)
    if isinstance(cfg, tuple):  # (config, subfolder of workdir)
        cfg, sub = cfg
        workdir = os.path.join(workdir, sub)
    resolve(train)(cfg, workdir)


def run_slices(train, cfg, workdir: str, parts: list[dict], *, narrow=narrowed, prepare=None) -> None:
    """Train an experiment's independent runs in parallel before its usual pass reads them back.

    ``train(cfg, workdir)`` (a module-level function) trains every run of ``cfg`` into its own
    subfolder of ``workdir`` and reads a finished one back instead of training it again;
    ``parts`` are JSON dicts naming independent slices of ``cfg`` (e.g. ``product(cfg, "seeds",
    "epsilons")``) and ``narrow(cfg, part)`` (module-level; default :func:`narrowed`) is the
    config of one slice, whose runs must be exactly the runs ``cfg`` has in that slice (same
    run keys, same subfolders), or ``(config, subfolder)`` when the slice trains into a
    subfolder of ``workdir``. ``prepare(cfg, workdir)``, if given, runs first, in this
    process (what every slice shares and would otherwise race to compute: a teacher's passes,
    a tokenizer). With more than one slice and ``--workers`` other than 0, each slice is a task
    of :mod:`fedpriv.executor` (local workers, or ``--cluster``); the caller's following pass
    finds every run finished. Outside an entry point (tests, notebooks) or with ``--workers 0``
    it does nothing: the caller's pass trains every run in this process."""
    opts = _LAST_RUN
    if len(parts) < 2 or opts.get("workers", "0") == "0" or "config" not in opts:
        return
    if prepare is not None:
        prepare(cfg, workdir)
    tasks = [executor.Task(_part_key(p), "experiments.common:run_slice",
                           {"train": _qualname(train), "narrow": _qualname(narrow), "config": opts["config"],
                            "part": p, "workdir": workdir}, outputs=workdir) for p in parts]
    backend = "ray" if opts.get("cluster") else "local"
    address = None if opts.get("cluster") in (None, "local") else opts["cluster"]
    executor.run_tasks(tasks, workers=opts["workers"], cores_per_worker=opts["cores_per_worker"],
                       log_dir=os.path.join(workdir, "_executor"), backend=backend, address=address)


def expected_config_type(name: str) -> type | None:
    """The config class ``experiments.<name>`` runs: the return annotation of
    ``configs/<name>.py``'s ``get_config`` (None where the module has no such config)."""
    try:
        module = importlib.import_module(f"configs.{name}")
    except ModuleNotFoundError:
        return None
    get = getattr(module, "get_config", None)
    kind = typing.get_type_hints(get).get("return") if callable(get) else None
    return kind if isinstance(kind, type) else None


def check_config_type(cfg, name: str, spec: str) -> None:
    """Refuse (:class:`ConfigError`, before any work) a config of another experiment given to
    ``experiments.<name>``, e.g. ``--config configs/fred_pipeline.py:smoke`` to ``lm_fl``: the
    config must be an instance of :func:`expected_config_type` (a subclass passes)."""
    expected = expected_config_type(name)
    if expected is None or isinstance(cfg, expected):
        return
    got = type(cfg)
    origin = getattr(sys.modules.get(got.__module__), "__file__", None)
    where = f" (configs/{os.path.basename(origin)})" if origin and got.__module__.startswith("configs.") else ""
    raise ConfigError(f"--config {spec!r} gives a config of type {got.__name__}{where}, but "
                      f"experiments.{name} takes {expected.__name__}: use --config "
                      f"configs/{name}.py:<scale>[,field=value,...]")


_WORKDIR_LOCKS: list = []


def hold_workdir(workdir: str) -> None:
    """One writer per workdir (``fedpriv.fl.workdir``): take ``workdir``'s exclusive lock for the
    rest of the run (released by :func:`cli` when ``main`` ends, by the OS if the process dies).
    A second run on the same workdir is refused in one line naming the holder (exit 2); a
    workdir that is a file or not writable likewise. Re-entrant: the library's ``train`` takes
    the same lock again inside the run."""
    _WORKDIR_LOCKS.append(workdir_lock.acquire(workdir))


def release_workdirs() -> None:
    """Release the workdir locks taken by :func:`hold_workdir` (newest first)."""
    while _WORKDIR_LOCKS:
        _WORKDIR_LOCKS.pop().release()


INVOCATION_FILE = "invocation.json"
_LAST_RUN: dict = {}


def code_paths() -> list[str]:
    """The repository's ``fedpriv/`` source files this process has imported (repo-relative,
    sorted): after a run, the library code its results depend on (the results page's
    staleness reads them)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = os.path.join(root, "fedpriv") + os.sep
    out = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and os.path.abspath(f).startswith(lib) and f.endswith(".py"):
            out.add(os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/"))
    return sorted(out)


def _cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def record_invocation(wall_s: float | None = None, cpu_s: float | None = None) -> None:
    """After an experiment's ``main`` returned normally under :func:`cli`: write
    ``<workdir>/invocation.json`` (module, ``--config`` spec, time, git commit (full), whether
    the tree had uncommitted changes and the ``fedpriv/`` files imported: :func:`code_paths`),
    which the results page (``python -m experiments.results``)
    shows next to the artefact, and the run's compact summary (``experiments.results.
    record_compact``: ``<workdir>/compact.json``, published under ``experiments/results/summaries/``
    for a ``small`` / ``paper`` run unless it was started with ``--no-publish``). A run that
    failed writes nothing, so the files always describe the outputs beside them."""
    if not _LAST_RUN or not os.path.isdir(_LAST_RUN["workdir"]):
        return

    from fedpriv.report import git_state
    inv = {"module": _LAST_RUN["module"], "config": _LAST_RUN["config"],
           "command": f"python -m {_LAST_RUN['module']} --config {_LAST_RUN['config']}",
           "time": time.strftime("%Y-%m-%d %H:%M:%S"), **git_state(), "code_paths": code_paths(),
           # this invocation only (runs read back from earlier invocations cost nothing here)
           "wall_clock_s": None if wall_s is None else round(wall_s, 1),
           "cpu_s": None if cpu_s is None else round(cpu_s, 1)}
    save_json(inv, os.path.join(_LAST_RUN["workdir"], INVOCATION_FILE))
    from experiments import compact
    compact.record_compact(inv, _LAST_RUN["workdir"], publish=_LAST_RUN.get("publish", True))


def printing_main(run, doc: str, name: str, *shown: str, slices=None):
    """The ``main(argv)`` of an experiment that is ``run(cfg, workdir)`` then printing the
    Markdown files ``shown`` (names in the workdir) that exist. ``slices(cfg)`` -> ``(train,
    parts)``: its independent runs, trained first by :func:`run_slices`."""
    def main(argv=None):
        cfg, workdir, _ = config_and_workdir(argv, doc, name)
        if slices is not None:
            train, parts = slices(cfg)
            run_slices(train, cfg, workdir, parts)
        run(cfg, workdir)
        for f in shown:
            if os.path.exists(path := os.path.join(workdir, f)):
                print(open(path).read())
    main.__doc__ = f"``python -m experiments.{name}``: run, then print {', '.join(shown)}."
    main.__module__ = run.__module__  # cli names the experiment in its one-line errors
    return main


def grouped(rows: list[dict], key: str) -> dict:
    """``rows`` grouped by ``row[key]`` (e.g. one group per mechanism over seeds), first-seen order."""
    out = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def seed_columns(rs: list[dict], val_loss: bool = False) -> dict:
    """The mean ± std columns over the seeds ``rs`` of one comparison row: val / test accuracy
    (%), optionally val loss, and s / round."""
    out = {"val accuracy (%)": pm([r["val_accuracy"] for r in rs], 100),
           "test accuracy (%)": pm([r["test_accuracy"] for r in rs], 100)}
    if val_loss:
        out["val loss"] = pm([r["val_loss"] for r in rs], 1, 3)
    out["s / round"] = pm([r["s_per_round"] for r in rs], 1, 2)
    return out


def lm_setting_note(c, cohort: str, simulated: str) -> str:
    """The first note line of an LM-FL comparison: corpus, model, rounds and cohort of config
    ``c`` (``configs/lm_fl.py``), and what a simulated noise cohort means for its epsilons."""
    return (f"{c.corpus}, {c.arch} (embed {c.embed_dim}, hidden {c.hidden_dim}), {c.rounds} rounds, {cohort} "
            f"{c.cohort_size}" + (f" with the noise of {c.noise_cohort_size} ({simulated})"
                                  if c.noise_cohort_size else ""))


def publish_rows(rows: list[dict], table: list[dict], workdir: str, name: str, *, title: str,
                 notes: list[str], verdicts: list, config, seeds, runs_name: str = "runs") -> None:
    """The end of a seeds x rows experiment: every run (``<runs_name>.{csv,md}``), the verdicts,
    the aggregated ``table`` (``<name>.{csv,md}``, printed) and ``summary.json`` (the rows and the
    run record: config, seeds, commit)."""
    write_table(rows, workdir, runs_name)
    write_verdicts(verdicts, workdir)
    _, md = write_table(table, workdir, name, notes=notes, title=title)
    save_json({"rows": rows, **run_record(config, list(seeds))}, os.path.join(workdir, "summary.json"))
    print(open(md).read())


# shared reporting lives in the library (fedpriv.report); re-exported for the experiments
from fedpriv.report import (  # noqa: E402,F401
    bar_chart,
    mean_std,
    metric_curve,
    plot_curves,
    pm,
    run_record,
    save_json,
    write_table,
    write_verdicts,
)
