"""The hook contract shipped with the library (``fedpriv.fl.testing``, issue 52 item 2): the
library's own algorithms pass it, and broken hooks are caught, each by the check that names it."""
import itertools

import jax
import jax.numpy as jnp
import optax
import pytest

from fedpriv.dp.testing import ContractViolation
from fedpriv.fl.client import ClientHooks, ServerHooks, default_client, optimizer_server, params_delta
from fedpriv.fl.client_lr_decay import decayed_client
from fedpriv.fl.fedprox import fedprox_client
from fedpriv.fl.scaffold import scaffold_client, scaffold_server
from fedpriv.fl.testing import check_client_hooks, check_server_hooks
from tests.fl.helpers import init_params, loss_fn, make_dataset

DATA = make_dataset(num_clients=4, seed=7)


@pytest.mark.parametrize("name", ["default", "fedprox", "lr_decay", "scaffold"])
def test_the_library_s_client_hooks_pass(name):
    params = init_params()
    hooks = {"default": lambda: default_client(loss_fn, optax.sgd(0.1)),
             "fedprox": lambda: fedprox_client(loss_fn, optax.sgd(0.1), 0.5),
             "lr_decay": lambda: decayed_client(loss_fn, optax.adam(0.05), 0.9),
             "scaffold": lambda: scaffold_client(loss_fn, 0.1)}[name]()
    server_state = (scaffold_server(optax.sgd(1.0), 0.25).init(params) if name == "scaffold"
                    else optax.sgd(1.0).init(params))
    check_client_hooks(hooks, params, DATA, server_state=server_state, clip_norm=0.3)


def test_the_library_s_server_hooks_pass():
    params = init_params()
    check_server_hooks(optimizer_server(optax.adam(0.1)), params)
    check_server_hooks(optimizer_server(optax.yogi(0.1)), params)
    release = {"model": init_params(), "control": init_params()}
    check_server_hooks(scaffold_server(optax.sgd(1.0), 0.25), params, release)


def _base():
    return default_client(loss_fn, optax.sgd(0.1))


def _dtype_changing():
    b = _base()

    def init(server):
        return b.init(server) + (jnp.zeros((), jnp.int32),)

    def step(server, carry, batch, rng):
        (p, s), aux = b.step(server, carry[:2], batch, rng)
        return (p, s, carry[2] + 0.5), aux  # int32 -> float32
    return ClientHooks(init, step, lambda server, c: params_delta(server, c[:2]))


_COUNTER = itertools.count()


def _impure():
    b = _base()

    def step(server, carry, batch, rng):  # a Python side effect baked into each trace
        (p, s), aux = b.step(server, carry, batch, rng)
        return (jax.tree_util.tree_map(lambda x: x + 1e-3 * next(_COUNTER), p), s), aux
    return ClientHooks(b.init, step, b.final)


def _int_release():
    b = _base()
    return ClientHooks(b.init, b.step,
                       lambda server, c: jax.tree_util.tree_map(lambda x: x.astype(jnp.int32),
                                                                params_delta(server, c)))


def _wrong_state():
    h = scaffold_client(loss_fn, 0.1)

    def final(server, carry):
        release, state = h.final(server, carry)
        return release, {"w": state["w"]}  # drops a leaf of its state
    return ClientHooks(h.init, h.step, final, state_init=h.state_init)


@pytest.mark.parametrize("make,says", [
    (_dtype_changing, "carry changed"),
    (_impure, "not pure"),
    (_int_release, "pytree of floats"),
    (_wrong_state, "client state differs"),
], ids=["dtype_changing_carry", "impure_step", "int_release", "wrong_client_state"])
def test_broken_client_hooks_fail_the_contract(make, says):
    params = init_params()
    hooks = make()
    server_state = (scaffold_server(optax.sgd(1.0), 0.25).init(params) if hooks.stateful
                    else optax.sgd(1.0).init(params))
    with pytest.raises(ContractViolation, match=says):
        check_client_hooks(hooks, params, DATA, server_state=server_state)


def test_broken_server_hooks_fail_the_contract():
    params = init_params()
    opt = optimizer_server(optax.sgd(1.0))
    drops = ServerHooks(opt.init, lambda p, s, r, t: ({"w": p["w"]}, s))
    with pytest.raises(ContractViolation, match="params' structure"):
        check_server_hooks(drops, params)
    grows = ServerHooks(lambda p: jnp.zeros(()), lambda p, s, r, t: (p, jnp.zeros((2,)) + s))
    with pytest.raises(ContractViolation, match="state's structure"):
        check_server_hooks(grows, params)


def test_the_sensitivity_check_has_teeth(monkeypatch):
    """An engine that skipped clipping (the sum taken with C = inf) fails the replace-one check."""
    import fedpriv.fl.testing as T
    real = T.packed_sum
    monkeypatch.setattr(T, "packed_sum", lambda h, o, v, ln, k, key, clip, **kw:
                        real(h, o, v, ln, k, key, jnp.inf, **kw))
    with pytest.raises(ContractViolation, match="replacing one client moved the clipped sum"):
        check_client_hooks(_base(), init_params(), DATA, server_state=optax.sgd(1.0).init(init_params()))


# ----------------------------------------------------------------------------- samplers
def test_the_library_s_samplers_pass_the_sampler_contract():
    from fedpriv.fl import samplers as S
    from fedpriv.fl.testing import check_sampler
    for s in (S.PoissonSampler(60, 0.1, seed=1), S.UniformSampler(60, 6, seed=1),
              S.ShuffledPassSampler(60, 6, seed=1), S.CyclicSampler(60, 6, seed=1),
              S.AmplifiedCyclicSampler(60, 6, 0.5, seed=1)):
        check_sampler(s, rounds=40)


def test_broken_samplers_fail_the_sampler_contract():
    """A shuffled pass that repeats each cohort for two rounds (the audit's 'twice per epoch'),
    one that claims a min-separation it does not keep, and one that reads a global RNG."""
    import dataclasses

    import numpy as np

    from fedpriv.fl.samplers import ShuffledPassSampler
    from fedpriv.fl.testing import check_sampler

    @dataclasses.dataclass(frozen=True)
    class TwicePerEpoch(ShuffledPassSampler):
        def sample(self, round_idx):
            return super().sample(round_idx // 2)

    @dataclasses.dataclass(frozen=True)
    class Overclaims(ShuffledPassSampler):  # a client may sit in the last round of an epoch and the first of the next
        min_separation = property(lambda self: 2 * self.rounds_per_epoch)

    @dataclasses.dataclass(frozen=True)
    class Impure(ShuffledPassSampler):
        def sample(self, round_idx):
            return np.sort(np.random.choice(self.num_clients, self.cohort_size, replace=False))

    cases = [(TwicePerEpoch(60, 6, seed=1), "twice in one period"),
             (Overclaims(60, 6, seed=1), "apart < min_separation"),
             (Impure(60, 6, seed=1), "not a pure function")]
    for sampler, says in cases:
        with pytest.raises(ContractViolation, match=says):
            check_sampler(sampler, rounds=40)
