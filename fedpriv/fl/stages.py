"""Multi-stage private pipelines: a list of stages, one ledger threaded through, resumable per stage.

Every pipeline of the three papers is a chain of releases and trainings on the same users, all
charged to one budget:

- Hou et al.: FreD release (DP means/covariances) -> central prefinetuning on the chosen public
  set -> DP FL-finetuning;
- Koga et al.: private unigram release -> PT stage on S -> FT stage on T;
- Wang et al. (Algorithm 1): DP-FL for T' rounds -> public mid-training -> DP-FL to round T.

``run_stages(stages, workdir, ledger)`` runs them in order. Stage ``i`` named ``name`` gets
``StageContext(name, workdir/<i>-<name>, ledger, results, log)``; it returns a JSON-able result
that later stages read from ``ctx.results[name]``. After each stage the pipeline's state file
``workdir/stages.json`` is replaced atomically: the config fingerprint, the stage names, the
results of the stages done so far and the ledger. Running the pipeline again:

- refuses (``ResumeMismatch``) a work directory holding a pipeline of another fingerprint or
  another list of stages, and a caller ledger whose budget or accounting differs from the
  recorded one (fail closed: the recorded ledger is the authority on what was spent);
- skips the stages already done (their results come from the file) and continues the ledger
  from the file;
- re-enters an interrupted stage. A training stage resumes from its own checkpoint through
  ``fedpriv.fl.loop.train`` (whose checkpoint carries the stage's recorded cost and is merged
  into the ledger); a release stage re-derives its release from its seeded keys and charges it
  once (its charge from the interrupted attempt was never committed to ``stages.json``).
  Stage functions must therefore be deterministic given the pipeline's config and seed.

Nothing here reads a training checkpoint: stages that continue another stage's run use
``fedpriv.fl.loop`` (``load_run``, ``fork_run``, ``replace_params``) on ``ctx.dir(name)``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping, Sequence

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.checkpoint import ResumeMismatch, json_safe

STATE = "stages.json"
FORMAT = "fedpriv-stages-v1"

__all__ = ["Stage", "StageContext", "PipelineResult", "run_stages", "stage_dir", "STATE"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of a pipeline: ``run(ctx) -> result`` (a JSON-able dict, or None)."""
    name: str
    run: Callable[["StageContext"], Any]


@dataclasses.dataclass
class StageContext:
    """What a stage sees: its ``name``, its own ``workdir``, the pipeline's one ``ledger``, the
    ``results`` of the stages before it (by name) and ``log``."""
    name: str
    workdir: str
    ledger: PrivacyLedger
    results: Mapping[str, Any]
    log: Callable[[str], None]
    root: str
    names: Sequence[str]

    def dir(self, name: str) -> str:
        """The work directory of the pipeline's stage ``name`` (e.g. to fork its run)."""
        return stage_dir(self.root, list(self.names).index(name), name)


@dataclasses.dataclass
class PipelineResult:
    results: dict
    ledger: PrivacyLedger
    resumed: list  # names of the stages whose results came from an earlier session


_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


def stage_dir(root: str, index: int, name: str) -> str:
    return os.path.join(root, f"{index}-{_SLUG.sub('_', name)}")


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            state = json.load(f)
        if state.get("format") != FORMAT:
            raise ValueError(f"format {state.get('format')!r}")
        state["ledger"] = PrivacyLedger.from_dict(state["ledger"])
        return state
    except (ValueError, KeyError, TypeError) as err:
        raise ResumeMismatch(f"{path} is not a readable pipeline state ({err}); use another "
                             "workdir") from err


def _save(path: str, fingerprint, names, results, ledger: PrivacyLedger) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "fingerprint": fingerprint, "stages": list(names),
                   "results": json_safe(results), "ledger": ledger.to_dict()}, f, indent=1)
    os.replace(tmp, path)


def run_stages(stages: Sequence[Stage], workdir: str, ledger: PrivacyLedger, *,
               fingerprint: Mapping | None = None, log: Callable[[str], None] = print) -> PipelineResult:
    """Run ``stages`` in order under one ``ledger``, resuming from ``workdir/stages.json``.

    Args:
      stages: the pipeline; names must be unique.
      workdir: the pipeline's directory; stage ``i`` works in ``workdir/<i>-<name>``.
      ledger: the pipeline's budget. On a fresh start it is used as given (entries it already
        holds count); on resume it must have the recorded budget and accounting, and its
        entries are replaced by the recorded ones.
      fingerprint: the config fields a resumed pipeline must match (JSON-able).
    Returns:
      ``PipelineResult(results, ledger, resumed)``; ``ledger`` is the caller's object.
    """
    names = [s.name for s in stages]
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"stage names must be unique non-empty strings, got {names}")
    fp = json_safe(dict(fingerprint or {}))
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, STATE)
    saved = _load(path)
    results: dict[str, Any] = {}
    if saved is not None:
        if saved["fingerprint"] != fp or saved["stages"] != names:
            diff = sorted(k for k in set(saved["fingerprint"]) | set(fp)
                          if saved["fingerprint"].get(k) != fp.get(k))
            what = f"config fields {diff}" if diff else f"stages {saved['stages']} -> {names}"
            raise ResumeMismatch(f"{workdir} holds a pipeline with other {what}; use another workdir")
        rec: PrivacyLedger = saved["ledger"]
        for f in ("epsilon", "delta", "neighboring", "unit", "accountant"):
            if getattr(rec, f) != getattr(ledger, f):
                raise ResumeMismatch(f"{workdir}: the recorded ledger has {f}={getattr(rec, f)!r}, "
                                     f"this run's {getattr(ledger, f)!r}; use another workdir")
        ledger.entries = list(rec.entries)
        results = dict(saved["results"])
    resumed = [n for n in names if n in results]
    for i, stage in enumerate(stages):
        if stage.name in results:
            log(f"stage {stage.name}: done in an earlier session (ledger spent {ledger.spent():.4g})")
            continue
        ctx = StageContext(stage.name, stage_dir(workdir, i, stage.name), ledger, dict(results),
                           log, workdir, names)
        os.makedirs(ctx.workdir, exist_ok=True)
        results[stage.name] = stage.run(ctx)
        _save(path, fp, names, results, ledger)
    return PipelineResult(results, ledger, resumed)
