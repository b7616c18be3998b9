"""Algorithm 1 at T' = T (Wang et al. 2023, Table 4's last column): public training after the
last private round, the final model is the publicly trained DP checkpoint, and the ledger holds
the same T-round DP-FTRL event as at T' = T/2 (public training is post-processing). Synthetic
tokens and a tiny LSTM: no teacher, seconds."""
import jax
import numpy as np
import optax
import pytest

from fedpriv.data.federated import FederatedDataset
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
from fedpriv.fl.loop import load_run
from fedpriv.fl.samplers import ShuffledPassSampler
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task
from fedpriv.public import algorithm as alg1
from fedpriv.public.pool import PublicPool

T, V, L, CLIENTS, POOL = 4, 16, 6, 16, 12


def _tokens(rng, n):
    t = rng.integers(4, V, size=(n, L + 1)).astype(np.int32)
    t[:, 0] = 2  # BOS
    return t


def test_t_prime_equal_to_rounds_is_post_processing(tmp_path):
    rng = np.random.default_rng(0)
    task = make_lm_task(make_lm(LMConfig(vocab_size=V, arch="lstm", embed_dim=4, hidden_dim=8,
                                         max_len=64)))
    data = FederatedDataset([f"c{i}" for i in range(CLIENTS)], {"tokens": _tokens(rng, 4 * CLIENTS)},
                            np.arange(0, 4 * CLIENTS + 1, 4), vocab_size=V, batch_size=4)
    sampler = ShuffledPassSampler(CLIENTS, 4, seed=0)
    alg = dp_ftrl(task.loss_fn, optax.sgd(0.5), server_optimizer("sgd", 1.0), clip_norm=1.0,
                  noise_multiplier=0.5, expected_cohort_size=4,
                  rounds_per_epoch=sampler.rounds_per_epoch)
    private = alg1.PrivateTraining(alg, sampler, data, data.client_ids, rounds=T, batch_size=4,
                                   seed=1, max_steps=1, progress=False)
    pool = PublicPool(tuple(f"s{i}" for i in range(POOL)), ("wikipedia",) * POOL,
                      _tokens(rng, POOL), np.full(POOL, L + 1, np.int32), _tokens(rng, POOL),
                      rng.normal(-3, 1, POOL).astype(np.float32), None, None, None, None, {})
    init = task.init(jax.random.key(0))
    stage1 = str(tmp_path / "stage1")
    outs = {}
    for tp in (T // 2, T):  # ascending: both fork the one shared stage-1 run
        spec = alg1.PublicTrainingSpec(t_prime=tp, q=0.5, selection="matching", beta=0.5,
                                       kd_beta=0.0, steps=3, batch_size=4, unk_correction=False)
        outs[tp] = alg1.algorithm1(private, task, init, pool, spec, workdir=str(tmp_path / f"tp{tp}"),
                                   stage1_workdir=stage1, ledger=PrivacyLedger(1e4, 1e-6),
                                   progress=False, log=lambda s: None)
    half, end = outs[T // 2], outs[T]
    for out in (half, end):
        assert int(out.result.state.round) == T
        assert [e.name for e in out.result.ledger.entries] == ["dp-ftrl", "public mid-training"]
        assert out.result.ledger.report()["entries"][1]["epsilon_alone"] == 0.0
    # the same DP-FTRL event (T rounds, same z, sampler) and the same epsilon at T' = T and T/2
    e_half, e_end = (o.result.ledger.report()["entries"][0] for o in (half, end))
    assert e_end["details"] == e_half["details"] and e_end["details"]["rounds"] == T
    assert end.result.ledger.spent() == pytest.approx(half.result.ledger.spent(), rel=1e-12)
    assert end.public["round"] == T and len(end.selected) == POOL // 2
    # the final model is the publicly trained round-T checkpoint: not the private one
    private_T = load_run(stage1, private.template(init))
    assert private_T.round == T
    leaf = lambda p: np.asarray(jax.tree_util.tree_leaves(p)[0])
    assert not np.allclose(leaf(end.result.state.params), leaf(private_T.state.params))
    # tree-noise state untouched by the public step
    assert int(end.result.state.noise_state.step) == int(private_T.state.noise_state.step)
    # resuming the finished T' = T run is a no-op
    again = alg1.algorithm1(private, task, init, pool, alg1.PublicTrainingSpec(
        t_prime=T, q=0.5, selection="matching", kd_beta=0.0, steps=3, batch_size=4,
        unk_correction=False), workdir=str(tmp_path / f"tp{T}"), ledger=PrivacyLedger(1e4, 1e-6),
        progress=False, log=lambda s: None)
    np.testing.assert_array_equal(leaf(again.result.state.params), leaf(end.result.state.params))
    with pytest.raises(ValueError, match="T' <= T"):
        alg1.algorithm1_stages(private, task, init, pool,
                               alg1.PublicTrainingSpec(t_prime=T + 1, selection="random"))
