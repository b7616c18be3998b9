"""Extensions, each ONE file and no edit elsewhere (issue 52, acceptance): a FedYogi server with
client momentum, a user-given banded Toeplitz mechanism, a GRU LM -- and the page's other examples
(DP SCAFFOLD as an LM-FL algorithm, a sampler, an experiment / artefact). Each test writes its one
file, taken verbatim from docs/extending.md, into a temporary directory, selects it from
``configs/lm_fl.py`` by naming the plugin module (``algorithm=<module>:<name>``,
``arch=<module>:<name>``), runs ``run_lm_fl`` at a tiny scale, and checks that the ledger charged
exactly the event the mechanism declares, written here independently with ``dp_accounting``."""
import math
import pathlib
import re
import sys
import textwrap
import types

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import lm_fl
from fedpriv.data import FederatedDataset
from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.recipes import lm
from fedpriv.recipes.lm_data import Prepared

V, L = 64, 8

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def doc_file(name: str) -> str:
    """The ``python`` block of docs/extending.md that starts with ``# file: <name>``: the tests
    run the files the page shows, as written there."""
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        first, _, rest = block.partition("\n")
        if first.strip() == f"# file: {name}":
            return rest
    raise AssertionError(f"docs/extending.md shows no file {name}")


@pytest.fixture(autouse=True)
def _registries_as_found():
    """A plugin registers its names in the library's registries, which live as long as the
    process: after each test they hold what they held before it, and the plugin modules
    (``ext_*``) are forgotten, so that every later test of this xdist worker (files run in any
    order) sees the built-ins only and a plugin imported again registers again."""
    from fedpriv import registry
    from fedpriv.recipes import algorithms
    regs = [v for mod in (registry, algorithms) for v in vars(mod).values() if isinstance(v, registry.Registry)]
    before = [dict(r._entries) for r in regs]
    yield
    for r, entries in zip(regs, before):
        r._entries.clear()
        r._entries.update(entries)
    for name in [m for m in sys.modules if m.startswith("ext_")]:
        del sys.modules[name]


def _plugin(tmp_path, monkeypatch, name: str, text: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))


def _federated(n: int, seed: int) -> FederatedDataset:
    rng = np.random.default_rng(seed)
    clients = {}
    for i in range(n):
        k = int(rng.integers(4, 12))
        toks = rng.integers(4, V, size=(k, L + 1)).astype(np.int32)
        toks[:, 0] = 2  # BOS
        clients[f"c{seed}-{i:03d}"] = {"tokens": toks}
    return FederatedDataset.from_clients(clients)


@pytest.fixture(scope="module")
def prepared():
    """A tiny synthetic federated corpus (the run is what is under test, not the data)."""
    train, val, test = _federated(24, 0), _federated(4, 1), _federated(4, 2)
    return Prepared(train, val, test, types.SimpleNamespace(vocab_size=V),
                    {"corpus": "synthetic", "vocabulary_public": True})


BASE = dict(target_epsilon="None", noise_multiplier=1.3, rounds=3, cohort_size=4, eval_every=3,
            checkpoint_every=3, max_eval_examples=16, batch_size=4, max_local_steps=2)


def _config(spec: str):
    over = dict(BASE, **dict(kv.split("=", 1) for kv in spec.split(",")))
    return lm_fl.get_config("smoke," + ",".join(f"{k}={v}" for k, v in over.items()))


def _run(cfg, prepared, tmp_path):
    ledger = PrivacyLedger(1e6, cfg.delta)
    summary = lm.run_lm_fl(cfg, str(tmp_path / "run"), prepared=prepared, ledger=ledger,
                           progress=False, log=lambda *_: None)
    return summary, ledger.entry("fl-training").event


def test_a_fedyogi_server_with_client_momentum_in_one_file(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_fedyogi", doc_file("ext_fedyogi.py"))
    cfg = _config("algorithm=ext_fedyogi:dp_fedyogi")
    assert cfg.algorithm == "ext_fedyogi:dp_fedyogi"
    task = lm.build_task(cfg, V)
    params = task.init(jax.random.key(0))
    alg, sampler, event, z = lm.build_algorithm(cfg, len(prepared.train), task.loss_fn)
    state = alg.init(params, jax.random.key(1))
    # the server is Yogi's (its second-moment state), the clients' optimizer has momentum
    assert type(state.opt_state[0]).__name__ == "ScaleByAdamState"
    from fedpriv.fl.client import ServerView
    carry = alg.client.init(ServerView(params, state.opt_state, state.round))
    assert any(isinstance(s, optax.TraceState) for s in jax.tree_util.tree_leaves(
        carry[1], is_leaf=lambda x: isinstance(x, optax.TraceState)))
    summary, charged = _run(cfg, prepared, tmp_path)
    q = cfg.cohort_size / len(prepared.train)
    own = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(1.3)), cfg.rounds)
    assert event_to_json(charged) == event_to_json(own)
    assert summary["algorithm"] == "ext_fedyogi:dp_fedyogi" and np.isfinite(summary["val_loss"])


def test_a_user_banded_toeplitz_mechanism_in_one_file(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_banded", doc_file("ext_banded.py"))
    cfg = _config("algorithm=ext_banded:dp_user_banded")
    summary, charged = _run(cfg, prepared, tmp_path)
    # cyclic cohorts of 4 from 24 users: min-separation 6 >= 3 bands; 3 rounds: one participation,
    # sensitivity = the norm of C's first column
    own = dpa.GaussianDpEvent(1.3 / math.sqrt(1.0 + 0.6 ** 2 + 0.3 ** 2))
    assert event_to_json(charged) == event_to_json(own)
    # and it is a sound mechanism: the privatizer contract and noise = charged event
    from fedpriv.dp.mechanisms import get_mechanism
    from fedpriv.dp.testing import check_mechanism
    mech = get_mechanism("user_banded")(1.0, 1.0, bands=3, min_separation=8, mf_rounds=8)
    cinv = np.linalg.inv(mech.strategy.matrix(8))
    check_mechanism(mech, covariance=lambda n: (cinv @ cinv.T)[:n, :n])
    assert np.isfinite(summary["val_loss"])


def test_a_gru_lm_in_one_file(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_gru", doc_file("ext_gru.py"))
    cfg = _config("arch=ext_gru:gru,algorithm=dp_ftrl")
    task = lm.build_task(cfg, V)
    params = task.init(jax.random.key(0))
    assert "GRUCell_0" in str(jax.tree_util.tree_structure(params))
    summary, charged = _run(cfg, prepared, tmp_path)
    # DP-FTRL: one tree per shuffled pass of 24 // 4 = 6 rounds; 3 rounds = one partial tree
    own = dpa.SingleEpochTreeAggregationDpEvent(1.3, 3)
    assert event_to_json(charged) == event_to_json(own)
    assert summary["num_params"] == sum(x.size for x in jax.tree_util.tree_leaves(params))
    # the LM contract's packed rows: where positions restart the state resets, so the second
    # sentence of a packed row is scored as if it were alone (what batching="packed" relies on)
    tokens = jnp.asarray(prepared.train.concat_examples()["tokens"][:2, :-1])
    row = tokens.reshape(1, 2 * L)
    pos = jnp.concatenate([jnp.arange(L), jnp.arange(L)])[None]
    seg = jnp.concatenate([jnp.ones(L, jnp.int32), 2 * jnp.ones(L, jnp.int32)])[None]
    packed = task.apply(params, row, segments=seg, positions=pos)
    alone = task.apply(params, tokens[1:2])
    np.testing.assert_allclose(np.asarray(packed[0, L:]), np.asarray(alone[0]), rtol=1e-5, atol=1e-5)


def test_unknown_names_fail_closed_listing_the_known_ones(tmp_path, monkeypatch):
    from fedpriv.errors import ConfigError
    from fedpriv.models.lm import LMConfig, make_lm
    with pytest.raises(ConfigError, match=r"arch must be one of \('lstm', 'transformer'.*got 'rnn'"):
        _config("arch=rnn")
    with pytest.raises(ConfigError, match="unknown model architecture 'rnn'; registered: .*lstm, transformer"):
        LMConfig(vocab_size=V, arch="rnn")
    bad = LMConfig(vocab_size=V)
    object.__setattr__(bad, "arch", "nope")  # past the config's check: make_lm still refuses
    with pytest.raises(ConfigError, match="unknown model architecture 'nope'"):
        make_lm(bad)
    with pytest.raises(ConfigError, match="cannot import plugin 'no_such_plugin'"):
        _config("algorithm=no_such_plugin:dp_x")
    _plugin(tmp_path, monkeypatch, "ext_empty", "x = 1\n")
    with pytest.raises(ConfigError, match=r"algorithm must be one of \('fedavg',.*got 'ext_empty:dp_x'"):
        _config("algorithm=ext_empty:dp_x")


def test_dp_scaffold_as_an_lm_fl_algorithm_in_one_registration(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_scaffold", doc_file("ext_scaffold.py"))
    cfg = _config("algorithm=ext_scaffold:dp_scaffold,server_optimizer=sgd,server_lr=1.0")
    summary, charged = _run(cfg, prepared, tmp_path)
    q = cfg.cohort_size / len(prepared.train)
    own = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(1.3)), cfg.rounds)
    assert event_to_json(charged) == event_to_json(own)  # c and c_i change nothing in the event
    from fedpriv.fl.loop import load_run
    assert load_run(str(tmp_path / "run")).round == cfg.rounds and np.isfinite(summary["val_loss"])


def test_a_sampler_in_one_file(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_sampler", doc_file("ext_sampler.py"))
    from fedpriv.dp import accounting
    from fedpriv.fl.testing import check_sampler
    from fedpriv.registry import SAMPLERS
    check_sampler(SAMPLERS.get("ext_sampler:round_robin")(24, 4, 0), rounds=30)
    cfg = _config("algorithm=ext_sampler:dp_ftrl_round_robin,rounds=8")
    task = lm.build_task(cfg, V)
    alg, sampler, event, z = lm.build_algorithm(cfg, len(prepared.train), task.loss_fn)
    assert type(sampler).__name__ == "RoundRobin" and alg.dp.restart_every == 6
    # one tree per pass of 6 rounds: 8 rounds are a full tree and a tree of 2
    want = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(1.3, 6), 1),
                                dpa.SingleEpochTreeAggregationDpEvent(1.3, 2)])
    assert accounting.compute_epsilon(event, 1e-6)[0] == pytest.approx(
        accounting.compute_epsilon(want, 1e-6)[0], rel=1e-9)


def test_an_artefact_in_two_files_with_no_edit_to_the_index(tmp_path):
    """The index finds the experiment module's own declaration (without importing it); the
    config loads at a scale and its privacy plan accounts."""
    import importlib.util

    from experiments import common, index
    from fedpriv.dp.plan import account
    (tmp_path / "experiments").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "experiments" / "my_table.py").write_text(doc_file("experiments/my_table.py"))
    config_file = tmp_path / "configs" / "my_table.py"
    config_file.write_text(doc_file("configs/my_table.py"))
    arts = index.declared(str(tmp_path / "experiments"))
    assert [(a.name, a.module, a.config, a.outputs) for a in arts] == [
        ("my-table", "my_table", "my_table", ("summary.md",))]
    cfg = common.load_config(f"{config_file}:smoke")
    spec = importlib.util.spec_from_file_location("my_table_config", config_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (run,) = account(module.privacy_plan(cfg))
    assert cfg.algorithm == "dp_ftrl" and 0 < run.epsilon <= cfg.target_epsilon * (1 + 1e-6)


def test_an_artefact_declaration_must_be_literal(tmp_path):
    from experiments import index
    (tmp_path / "bad.py").write_text("NAME = 'x'\nARTEFACTS = (Artefact(NAME, 'p', 'w', None, None),)\n")
    with pytest.raises(ValueError, match="non-literal argument"):
        index.declared(str(tmp_path))
