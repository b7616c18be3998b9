"""Three extensions, each ONE file and no edit elsewhere (issue 52, acceptance): a FedYogi server
with client momentum, a user-given banded Toeplitz mechanism, a GRU LM. Each test writes its one
file into a temporary directory, selects it from ``configs/lm_fl.py`` by naming the plugin module
(``algorithm=<module>:<name>``, ``arch=<module>:<name>``), runs ``run_lm_fl`` at a tiny scale, and
checks that the ledger charged exactly the event the mechanism declares, written here
independently with ``dp_accounting``. The files are the ones docs/extending.md shows."""
import math
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

FEDYOGI = '''
"""DP-FedAvg with a FedYogi server (Reddi et al. 2021) and client momentum: one file."""
import optax

from fedpriv.recipes.algorithms import LMAlgorithm, register_algorithm
from fedpriv.registry import OPTIMIZERS


@OPTIMIZERS.register("fedyogi")
def fedyogi(learning_rate, **_):
    return optax.yogi(learning_rate, b1=0.9, b2=0.99, eps=1e-3)


def sgd_momentum(learning_rate, **_):
    return optax.sgd(learning_rate, momentum=0.9)


register_algorithm("dp_fedyogi", LMAlgorithm(mechanism="gaussian", sampler="poisson",
                                             server_optimizer="fedyogi", client_optimizer=sgd_momentum))
'''

BANDED = '''
"""A user-given banded Toeplitz matrix-factorization mechanism (Choquette-Choo et al. 2023):
C = toeplitz(1, 0.6, 0.3), exact sensitivity at min-separation >= 3 bands. One file."""
import dataclasses
from typing import ClassVar

from fedpriv.dp.matrix import BandedStrategy
from fedpriv.dp.mechanisms import MatrixDPConfig, register_mechanism
from fedpriv.recipes.algorithms import LMAlgorithm, register_algorithm

COEFFS = (1.0, 0.6, 0.3)


@dataclasses.dataclass(frozen=True)
class UserBanded(MatrixDPConfig):
    mechanism: str = "user_banded"
    banded: ClassVar[bool] = True   # exact sensitivity; amplified under AmplifiedCyclicSampler

    @property
    def strategy(self):
        return BandedStrategy(COEFFS)

    @classmethod
    def run_fields(cls, sampler, rounds, options):
        return {"min_separation": sampler.min_separation, "mf_rounds": rounds, "bands": len(COEFFS)}


register_mechanism("user_banded", UserBanded)
register_algorithm("dp_user_banded", LMAlgorithm(mechanism="user_banded", sampler="cyclic"))
'''

GRU = '''
"""A GRU on-device LM (Cho et al. 2014): embedding E -> GRU H -> dense E -> dense V. One file."""
import flax.linen as nn
import jax.numpy as jnp

from fedpriv.registry import MODELS


class _Step(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, h, inputs):
        x, keep = inputs                     # keep: 0 where a packed row starts a new sentence
        h, _ = nn.GRUCell(features=self.hidden)(h * keep[:, None], x)
        return h, h


class GRULM(nn.Module):
    """``int[B, L] -> float32[B, L, V]`` (the LM contract of fedpriv.models.lm)."""
    config: object

    @nn.compact
    def __call__(self, tokens, *, deterministic=True, segments=None, positions=None):
        cfg = self.config
        x = nn.Embed(cfg.vocab_size, cfg.embed_dim)(tokens)
        keep = jnp.ones(tokens.shape, x.dtype) if positions is None else (positions != 0).astype(x.dtype)
        scan = nn.scan(_Step, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)
        _, h = scan(cfg.hidden_dim)(jnp.zeros((tokens.shape[0], cfg.hidden_dim), x.dtype), (x, keep))
        return nn.Dense(cfg.vocab_size)(nn.Dense(cfg.embed_dim)(h))


MODELS.register("gru", GRULM)
'''


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


def _config(spec: str):
    return lm_fl.get_config("smoke,target_epsilon=None,noise_multiplier=1.3,rounds=3,cohort_size=4,"
                            "eval_every=3,checkpoint_every=3,max_eval_examples=16,batch_size=4,"
                            "max_local_steps=2," + spec)


def _run(cfg, prepared, tmp_path):
    ledger = PrivacyLedger(1e6, cfg.delta)
    summary = lm.run_lm_fl(cfg, str(tmp_path / "run"), prepared=prepared, ledger=ledger,
                           progress=False, log=lambda *_: None)
    return summary, ledger.entry("fl-training").event


def test_a_fedyogi_server_with_client_momentum_in_one_file(tmp_path, monkeypatch, prepared):
    _plugin(tmp_path, monkeypatch, "ext_fedyogi", FEDYOGI)
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
    _plugin(tmp_path, monkeypatch, "ext_banded", BANDED)
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
    _plugin(tmp_path, monkeypatch, "ext_gru", GRU)
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
