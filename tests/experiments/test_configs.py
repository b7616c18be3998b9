"""Every experiment config: scales, typed overrides, clear errors -- and every scale of every
config accounted (its privacy plan replayed through the run's ledger) without data or training.

The configs are enumerated from ``configs/`` (a new file is covered automatically). Each must
expose ``privacy_plan(cfg) -> fedpriv.dp.plan.PrivacyPlan`` (``fedpriv.recipes.plans``); a
config without one fails here, and an experiment that touches no private data says so with
``PrivacyPlan.nothing(reason)``.
"""
import dataclasses
import importlib
import math
import pathlib

import pytest

from experiments import calibrations, common
from fedpriv.data.errors import ConfigError
from fedpriv.dp.ledger import PrivacyBudgetExceeded
from fedpriv.dp.plan import Charge, PlannedRun, PrivacyPlan, account
from fedpriv.recipes import plans

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_CONFIGS = ("common", "__init__")
DEFAULT_SCALES = ("smoke", "small", "paper")


def config_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in NOT_CONFIGS)


def config_module(name: str):
    return importlib.import_module(f"configs.{name}")


def scales_of(name: str) -> tuple[str, ...]:
    scales = getattr(config_module(name), "SCALES", None)
    return tuple(scales) if scales else DEFAULT_SCALES


PAIRS = [(n, s) for n in config_names() for s in scales_of(n)]


def privacy_plan(name: str, cfg) -> PrivacyPlan:
    hook = getattr(config_module(name), "privacy_plan", None)
    if not callable(hook):
        pytest.fail(f"configs/{name}.py has no privacy_plan(cfg): every config must say what its "
                    "experiment charges (fedpriv.recipes.plans) or that it releases nothing "
                    "(fedpriv.dp.plan.PrivacyPlan.nothing)")
    return hook(cfg)


def test_enumeration_covers_the_known_configs():
    names = config_names()
    for known in ("demo", "fred_pipeline", "fred_table", "latency_figure", "lm_fl", "mf_comparison",
                  "population_expansion", "privacy_utility", "public_training"):
        assert known in names


@pytest.mark.parametrize("name,scale", PAIRS)
def test_every_scale_loads(name, scale):
    if scale == "paper":  # a paper scale plans, or refuses in one line
        pytest.skip("paper scales: tests/experiments/test_paper_configs.py")
    assert common.load_config(f"configs/{name}.py:{scale}") is not None


# the two slowest accountings (~1 min each) run from their own file,
# tests/experiments/test_configs_heavy.py, so that pytest-xdist (--dist loadfile) can run them
# beside this file
HEAVY = [("population_expansion", "small"), ("iw_regime", "small")]


@pytest.mark.parametrize("name,scale", [p for p in PAIRS if p not in HEAVY])
def test_every_scale_is_accounted(name, scale):
    check_accounted(name, scale)


def check_accounted(name: str, scale: str) -> None:
    """The plan's every charge is accepted by a ledger with the run's budget: the run would not
    be refused, and no reported epsilon exceeds its claim."""
    if scale == "paper":  # a paper scale plans (both epsilons), or refuses in one line
        pytest.skip("paper scales: tests/experiments/test_paper_configs.py")
    with calibrations.recording(use_table=True) as searched:
        plan = privacy_plan(name, common.load_config(f"configs/{name}.py:{scale}"))
        accounts = account(plan)  # raises PrivacyBudgetExceeded / ValueError: the test fails loudly
    check_tabulated(name, scale, searched)
    if not accounts:
        assert plan.releases_nothing, f"{name}:{scale} charges nothing and does not say why"
        return
    for a in accounts:
        if a.budget is None:  # a declared non-private baseline (FedAvg)
            assert not a.charges and a.epsilon == math.inf
            continue
        assert a.charges, f"{name}:{scale} {a.name}: a DP claim with no charge"
        assert 0 < a.epsilon_dp <= a.budget * (1 + 1e-9), (name, scale, a)


def check_tabulated(name: str, scale: str, searched: list) -> None:
    """Every noise calibration of the plan came from the committed table (fedpriv/dp/calibrated.py,
    each entry checked by two evaluations as it is read): none was searched."""
    assert not searched, (
        f"{name}:{scale} calibrates z = {', '.join(repr(e.z) for e in searched)} by search: the committed "
        "table lacks it, or holds a stale entry. Run `python -m experiments.calibrations` and commit "
        "fedpriv/dp/calibrated.py")


# ------------------------------------------------------------------ the check refuses
def test_fred_pipeline_paper_with_the_inherited_fixed_z_is_refused():
    """The past bug: fred_pipeline:paper inherited noise_multiplier=8.83 from lm_fl:paper; the
    pipeline ledger (FreD + FL within total_epsilon = 2.46) refused it before training."""
    cfg = common.load_config("configs/fred_pipeline.py:paper,num_sentences=19782")  # 150K: refused
    assert cfg.lm.noise_multiplier is None  # the fix: z is calibrated to what FreD left
    with pytest.raises(ConfigError, match="both set"):  # z beside the target: refused (issue 24)
        dataclasses.replace(cfg.lm, noise_multiplier=8.83)
    broken = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, noise_multiplier=8.83,
                                                             target_epsilon=None))
    with pytest.raises(PrivacyBudgetExceeded, match="would raise epsilon"):
        account(privacy_plan("fred_pipeline", broken))


def test_noise_multiplier_and_target_epsilon_together_are_refused():
    """Issue 24 item 1: both set trained at the fixed z (epsilon 1,454.8 for a target of 1).
    They are exclusive, by override, through a scale's default, and by dataclasses.replace."""
    with pytest.raises(ConfigError, match="noise_multiplier and target_epsilon are both set"):
        common.load_config("configs/lm_fl.py:small,noise_multiplier=1.0,target_epsilon=1.0")
    with pytest.raises(ConfigError, match=r"from scale 'smoke'.*add target_epsilon=None"):
        common.load_config("configs/lm_fl.py:smoke,noise_multiplier=0.05")
    cfg = common.load_config("configs/lm_fl.py:small,target_epsilon=None,noise_multiplier=1.0")
    with pytest.raises(ConfigError, match="both set"):
        dataclasses.replace(cfg, target_epsilon=1.0)
    # a fixed z with no target claims nothing in particular: its own epsilon is its budget
    own = account(privacy_plan("lm_fl", cfg))
    assert own[0].epsilon_dp > 1.0


def test_cohort_larger_than_the_population_is_refused():
    cfg = common.load_config("configs/lm_fl.py:smoke,cohort_size=100")  # 48 training clients
    with pytest.raises(ValueError, match="cohort_size 100 > 48"):
        account(privacy_plan("lm_fl", cfg))


def test_a_plan_must_charge_or_declare_it_releases_nothing():
    with pytest.raises(ValueError, match="releases nothing"):
        account(PrivacyPlan())
    assert account(PrivacyPlan.nothing("simulation")) == []
    with pytest.raises(PrivacyBudgetExceeded, match="claims no budget"):
        account(PrivacyPlan((PlannedRun("x", None, 1e-6, (Charge("c", _gaussian(1.0)),)),)))


def test_populations_come_from_the_known_corpus_sizes():
    lm = common.load_config("configs/lm_fl.py:small")
    assert plans.lm_train_clients(lm) == 1053  # runs/*/summary.json: train_clients
    assert plans.fred_train_clients(common.load_config("configs/fred_pipeline.py:smoke")) == 64
    pe = common.load_config("configs/population_expansion.py:smoke")
    assert plans.expansion_train_clients("topics", pe) == (27, 9)
    with pytest.raises(ValueError, match="no known client count"):  # never a guessed population
        plans.corpus_clients("wikitext")
    with pytest.raises(ConfigError, match="needs corpus_path"):  # the papers' data: counted in the file
        plans.corpus_clients("stackoverflow")


def _gaussian(z):
    import dp_accounting as dpa
    return dpa.GaussianDpEvent(z)


# ------------------------------------------------------------------ overrides
def test_typed_overrides_and_errors():
    cfg = common.load_config("configs/lm_fl.py:small,rounds=7,split=0.5/0.25/0.25,noise_cohort_size=None,"
                             "noise_multiplier=1.5,target_epsilon=None,tokenizer=word")
    assert cfg.rounds == 7 and cfg.split == (0.5, 0.25, 0.25) and cfg.noise_cohort_size is None
    assert cfg.target_epsilon is None and cfg.noise_multiplier == 1.5 and cfg.tokenizer == "word"
    pe = common.load_config("configs/population_expansion.py:smoke,seeds=0/1/2,datasets=topics")
    assert pe.seeds == (0, 1, 2) and pe.datasets == ("topics",)
    fp = common.load_config("configs/fred_pipeline.py:smoke,compare_all=true,pca_dims=None,total_epsilon=5")
    assert fp.compare_all is True and fp.pca_dims is None and fp.lm.target_epsilon == 5.0
    with pytest.raises(ValueError, match="unknown config field"):
        common.load_config("configs/lm_fl.py:small,roundz=3")
    with pytest.raises(ValueError, match="unknown scale"):
        common.load_config("configs/lm_fl.py:huge")
    with pytest.raises(FileNotFoundError):
        common.load_config("configs/nope.py:small")


@pytest.mark.parametrize("name", ["lm_fl", "public_training", "wang_figure3", "privacy_utility"])
def test_transformer_builds_at_every_scale_and_bad_heads_are_refused(name):
    """Issue 11: the transformer columns crashed at smoke/small (num_heads=10 vs hidden 16/128);
    num_heads is a config field, chosen per scale, and a non-divisor is one ConfigError."""
    from fedpriv.recipes import lm
    # public_training's paper scale has both columns (archs=lstm/transformer): the Transformer alone
    one = ",archs=none,student_server_lrs=none" if name == "public_training" else ""
    for scale in scales_of(name):
        cfg = common.load_config(f"configs/{name}.py:{scale},arch=transformer{one}")
        c = getattr(cfg, "lm", cfg)
        assert c.hidden_dim % c.num_heads == 0
        if scale == "smoke":
            lm.build_task(c, 64)  # the model builds
    with pytest.raises(ValueError, match="num_heads=7 must divide"):
        common.load_config(f"configs/{name}.py:smoke,arch=transformer,num_heads=7")


def test_expansion_stages_are_charged_their_budget_under_the_configs_accountant():
    """Issue 24: the stages of population_expansion were calibrated with RDP and charged with
    the config's accountant ("best"), so each spent ~8% less than its budget (more noise than
    it paid for). Each stage now calibrates with the accountant that charges it."""
    from fedpriv.dp import accounting
    from fedpriv.expansion.pipeline import calibrate_stage
    for accountant in ("best", "rdp"):
        z = calibrate_stage(100, 0.05, 50, 100, 1.0, 2.0, 1e-5, accountant=accountant)
        from fedpriv.fl import algorithms as algs
        from fedpriv.fl.samplers import PoissonSampler
        event = algs.privacy_event(algs.DPConfig(1.0, z, "gaussian", noise_cohort_size=100),
                                   PoissonSampler(100, 0.05), 50)
        eps = accounting.compute_epsilon(event, 1e-5, accountant=accountant)[0]
        assert 2.0 * (1 - 5e-3) < eps <= 2.0 * (1 + 1e-9), (accountant, z, eps)
    assert calibrate_stage(100, 0.05, 50, 100, 1.0, 2.0, 1e-5, accountant="best") < \
        calibrate_stage(100, 0.05, 50, 100, 1.0, 2.0, 1e-5, accountant="rdp")


# ------------------------------------------------------------------ issue 54: the executed epsilon
def test_the_expansion_plans_executed_epsilon_is_that_of_the_run_executed():
    """population_expansion charges each stage the SIMULATED population's event (noise of the
    noise cohort M, Poisson at q = m / n) and reports beside it the epsilon of the run executed:
    m clients trained per round under that same noise, i.e. multiplier z m / M at the same q
    (``tests/oracles.py``, dp_accounting's RDP: the smoke config's accountant). Per stage, and
    per run (each population: its unigram release, pure eps0 added, and its stages' executed
    events), never the simulated epsilon in its place."""
    from fedpriv.expansion.data import SOURCE, TARGET
    from tests.oracles import executed_noise_cohort_event, rdp_epsilon
    # three rows cover every stage shape: alpha*C on T, a weighted S u T stage after the unigram
    # releases, and PT's two stages on disjoint populations
    cfg = common.load_config("configs/population_expansion.py:smoke,schemes=T w. alpha*C/IW/IWPT")
    assert cfg.accountant == "rdp" and cfg.train_cohort < cfg.noise_cohort
    plan = plans.population_expansion_plan(cfg)
    n_s, n_t = plans.expansion_train_clients("topics", cfg)
    alpha, users = n_t / (n_s + n_t), {SOURCE: n_s, TARGET: n_t}
    assert len(plan.runs) == len(cfg.training_schemes)
    for scheme, run, acc in zip(cfg.training_schemes, plan.runs, account(plan, executed=True)):
        stages = [c for c in run.charges if c.executed_event is not None]
        assert len(stages) == len(scheme.stages)
        per_pop: dict = {}
        for c in run.charges:
            if c.executed_event is None:  # a unigram release: pure DP, executed as charged
                for p in c.populations:
                    per_pop.setdefault(p, [[], 0.0])[1] += scheme.unigram_budget[0]
        for stage, rounds, c in zip(scheme.stages, scheme.stage_rounds(cfg.rounds), stages):
            n = sum(users[p] for p in stage.populations)
            m = stage.cohort_size(cfg.train_cohort, alpha)
            noise = stage.cohort_size(cfg.noise_cohort, alpha)
            sim = c.event  # rounds x PoissonSampled(m / n, Gaussian(z)): the charged simulation
            q, z = sim.event.sampling_probability, sim.event.event.noise_multiplier
            assert sim.count == rounds and q == pytest.approx(m / n, rel=1e-12) and m < noise
            want = executed_noise_cohort_event(z, q, m, noise, rounds)
            got = accounting_epsilon(c.executed_event, run.delta)
            assert got == pytest.approx(rdp_epsilon([want], run.delta), rel=1e-9)
            assert got > 2 * accounting_epsilon(sim, run.delta)  # never the simulated one
            for p in c.populations:
                per_pop.setdefault(p, [[], 0.0])[0].append(want)
        oracle = max(rdp_epsilon(evs, run.delta) + pure if evs else pure for evs, pure in per_pop.values())
        assert acc.epsilon_executed == pytest.approx(oracle, rel=1e-9), (run.name, acc)
        assert acc.epsilon_executed > acc.epsilon


def test_an_lm_plans_executed_epsilon_is_that_of_the_run_executed():
    """lm_fl with a noise cohort M: the charge is the simulated run's (tree of multiplier z, one
    per pass), and the plan's executed event is the run that trains m per round under that noise:
    one tree of multiplier z m / M per pass of the run (three passes here)."""
    from tests.oracles import per_pass_event, rdp_epsilon
    cfg = common.load_config("configs/lm_fl.py:smoke,noise_cohort_size=40,rounds=13")
    (run,) = plans.lm_fl_plan(cfg).runs
    (c,) = run.charges
    passes = c.event.events if hasattr(c.event, "events") else [c.event]
    z = passes[0].noise_multiplier
    per_epoch = plans.lm_train_clients(cfg) // cfg.cohort_size
    assert -(-cfg.rounds // per_epoch) == len(passes) == 3
    want = per_pass_event(z * cfg.cohort_size / cfg.noise_cohort_size, cfg.rounds, per_epoch, "tree")
    assert accounting_epsilon(c.executed_event, cfg.delta) == pytest.approx(
        rdp_epsilon([want], cfg.delta), rel=1e-9)
    (acc,) = account(plans.lm_fl_plan(cfg), executed=True)
    assert acc.epsilon_executed == pytest.approx(rdp_epsilon([want], cfg.delta), rel=1e-9)


def accounting_epsilon(event, delta: float) -> float:
    from fedpriv.dp import accounting
    return accounting.compute_epsilon(event, delta, accountant="rdp")[0]
