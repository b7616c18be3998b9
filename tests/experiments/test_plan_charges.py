"""Every config's privacy plan charges exactly what the run it plans charges (issue 24, "each
plan's charges equal to the ledger entries of the run it plans").

For every config in ``configs/`` (enumerated, so a new one is covered), the smoke experiment runs
into a temporary workdir while every :class:`~fedpriv.dp.ledger.PrivacyLedger` it creates is
recorded; at the end the ledgers' entries are compared with ``privacy_plan(cfg)``:

* every planned run's charges (entry names and ``dp_accounting`` events, exactly, as JSON) are
  the complete entries of some ledger the run made, with the plan's delta, relation and
  accountant (a plan accounted otherwise than its run would report another epsilon) and a
  budget no larger than the plan's;
* every ledger the run made holds a prefix of some planned run's charges (nothing unplanned: a
  pipeline's ledger is also seen after its first stages);
* a plan that "releases nothing" opens no ledger with an entry.

The cheapest structure that still runs each experiment's own code: the FL round loop
(``fedpriv.fl.loop._train``) is replaced by its charging step alone -- the loop's own
``privacy_event(algorithm.dp, sampler, rounds)`` spent under the run's ``stage`` in the run's
ledger, exactly as ``_train`` does before round 0 -- returning the initial model, so no round
is trained (``tests/fl/test_engine.py`` and ``tests/fl/test_ddg_engine.py`` check that the real
loop charges that event). Data preparation, populations, samplers, noise calibration, FreD and
unigram releases and every ledger are the experiments' own. FreD releases made without a ledger
(``fred_table``) are recorded from ``private_stats`` itself. Configs whose smoke run stays slow
even so are listed in ``SLOW`` with the reason.
"""
from __future__ import annotations

import importlib
import inspect
import json
import pathlib

import numpy as np
import pytest

from experiments import common
from fedpriv.dp import moments
from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import LedgerEntry, PrivacyLedger, event_to_json
from fedpriv.fl import loop
from fedpriv.fl.algorithms import privacy_event

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_CONFIGS = ("common", "__init__")

# config -> why its smoke run is not replayed here (each is > ~20 s even with the loop stubbed)
SLOW = {
    "public_training": "loads the 135M-parameter GGUF teacher (minutes on 2 CPU cores); its FL "
                       "runs are lm_fl's, whose plan-vs-run charges are checked here",
    "wang_ablations": "loads the GGUF teacher (as public_training)",
    "wang_pool": "public_training's experiment and plan (plans.public_training_plan) on another pool: as "
                 "public_training",
    "wang_figure3": "loads the GGUF teacher and trains a non-private oracle (as public_training)",
    "pre_text": "loads the GGUF teacher and generates with it; tests/experiments/test_pre_text.py "
                "compares every arm's ledger with its plan on the real smoke run",
    "llm_lora": "loads the GGUF teacher; tests/experiments/test_llm_lora.py compares every private "
                "arm's ledger with its plan on the real smoke run",
}


def config_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in NOT_CONFIGS)


def _key(event) -> str:
    return json.dumps(event_to_json(event), sort_keys=True)


def _charging_step_only(algorithm, init_params, dataset, client_ids, sampler, *, rounds, seed,
                        ledger, nonprivate_ok, stage, populations, **_):
    """``fedpriv.fl.loop._train`` up to and including its charge, then the initial model."""
    dp = algorithm.dp
    event = privacy_event(dp, sampler, int(rounds)) if dp.is_private else None
    if dp.is_private and ledger is None and not nonprivate_ok:
        raise loop.PrivacyAccountingError(f"stage {stage!r}: a private algorithm needs a ledger")
    if event is not None and ledger is not None:
        ledger.spend(stage, event, tuple(populations), note=f"{rounds} rounds")
    state = algorithm.init(init_params, tagged_key(seed, stage, "init"))
    return loop.TrainResult(state, ledger if dp.is_private else None, [], [], 0,
                            event if ledger is not None else None, None, int(rounds))


def _random_embeddings(embedder, private, candidates, batch_size, cache=None, progress=True):
    rng = np.random.default_rng(0)
    emb = lambda texts: rng.normal(size=(len(texts), 16)).astype(np.float32)
    return ({u: emb(t) for u, t in private.items()}, {n: emb(t) for n, t in candidates.items()},
            0.0)


def _run_smoke(name: str, workdir: pathlib.Path, monkeypatch):
    """Run ``experiments.<name>`` at smoke scale; returns (plan, [ledger]) with every ledger
    created (and every FreD release made without one, as a one-entry pseudo-ledger)."""
    made: list = []
    init = PrivacyLedger.__init__

    def recording_init(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(PrivacyLedger, "__init__", recording_init)
    monkeypatch.setattr(loop, "_train", _charging_step_only)
    import fedpriv.fred.compare as compare
    real_stats = compare.private_stats

    def recording_stats(*a, **kw):
        rel = real_stats(*a, **kw)
        if kw.get("ledger") is None:
            pseudo = PrivacyLedger(rel.epsilon_basic, rel.delta_total, rel.relation)
            pseudo.entries.append(LedgerEntry("FreD release (mean + covariance)",
                                              moments.release_event(rel.events), ("users",)))
        return rel

    monkeypatch.setattr(compare, "private_stats", recording_stats)
    # FreD's events depend on (epsilon, delta) and the ledger, not on the embeddings: the BERT
    # embedder is replaced by random 16-d vectors (one per sentence, as embed_all returns)
    from fedpriv.models import bert
    monkeypatch.setattr(bert, "load_embedder", lambda **_: None)
    cfg = common.load_config(f"configs/{name}.py:smoke")
    plan = importlib.import_module(f"configs.{name}").privacy_plan(cfg)
    mod = importlib.import_module(f"experiments.{name}")
    import fedpriv.recipes.fred_mixtures as mixtures
    import fedpriv.recipes.fred_pipeline as pipeline
    for m in (pipeline, mixtures, mod):
        if hasattr(m, "embed_all"):
            monkeypatch.setattr(m, "embed_all", _random_embeddings)
    if hasattr(mod, "run"):
        params = inspect.signature(mod.run).parameters
        kw = {k: v for k, v in (("progress", False), ("log", lambda *_: None)) if k in params}
        mod.run(cfg, str(workdir), **kw)
    elif name in ("lm_fl", "demo"):  # the recipe is the experiment
        from fedpriv.recipes.lm import run_lm_fl
        run_lm_fl(cfg, str(workdir))
    else:  # its command line
        mod.main(["--config", f"configs/{name}.py:smoke", "--workdir", str(workdir)])
    return plan, [led for led in made if led.entries]


@pytest.mark.parametrize("name", config_names())
def test_plan_charges_equal_the_runs_ledger_entries(name, tmp_path, monkeypatch):
    if name in SLOW:
        pytest.skip(f"{name}: {SLOW[name]}")
    plan, ledgers = _run_smoke(name, tmp_path / "w", monkeypatch)
    if plan.releases_nothing:
        assert not ledgers, f"{name}: the plan releases nothing but the run charged {ledgers}"
        return
    # entry names are labels (a pipeline names its FL entry after the candidate FreD chose);
    # what is compared is the sequence of privacy events, exactly
    seen = [(tuple(_key(e.event) for e in led.entries if not e.nonprivate), led) for led in ledgers]
    planned = [(tuple(_key(c.event) for c in run.charges), run) for run in plan.runs
               if run.charges]  # a run with no charge (a non-private baseline) opens no ledger
    assert planned, f"{name}: the plan charges nothing and does not say it releases nothing"
    for charges, run in planned:
        match = [led for got, led in seen if got == charges]
        assert match, (f"{name}: planned run {run.name!r} charges {[c.name for c in run.charges]} "
                       f"but no ledger of the run holds exactly those events; the run's ledgers: "
                       f"{[[e.name for e in led.entries] for _, led in seen]}")
        # the plan is accounted as the run's ledger accounts (issue 54: same accountant)
        assert any(led.delta == run.delta and led.neighboring == run.neighboring
                   and led.accountant == run.accountant
                   and led.epsilon <= run.epsilon * (1 + 1e-9) for led in match), (
            f"{name}: {run.name!r}: budget/delta/relation/accountant differ: plan "
            f"{(run.epsilon, run.delta, run.neighboring, run.accountant)}, run "
            f"{[(led.epsilon, led.delta, led.neighboring, led.accountant) for led in match]}")
        want_np = {n for n, _ in run.nonprivate}
        assert any({e.name for e in led.entries if e.nonprivate} == want_np for led in match), (
            f"{name}: {run.name!r}: non-private records differ from the plan's {want_np}")
    for got, led in seen:
        assert any(got == charges[:len(got)] for charges, _ in planned), (
            f"{name}: the run charged {[e.name for e in led.entries]}, whose events no planned "
            "run starts with")
