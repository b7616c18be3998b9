"""``client_compute`` (configs/lm_fl.py): bfloat16 client passes leave the DP release float32,
are refused when misspelt, and float32 runs keep the fingerprint of runs from before the field."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.common import ConfigError
from configs.lm_fl import get_config
from fedpriv.fl.client import make_local_step
from fedpriv.recipes.lm import client_compute_dtype, run_fingerprint


def test_client_compute_is_validated_and_float32_fingerprints_are_unchanged():
    with pytest.raises(ConfigError, match="client_compute"):
        get_config("smoke,client_compute=float16")
    cfg = get_config("smoke")
    assert client_compute_dtype(cfg) is None
    assert "client_compute" not in run_fingerprint(cfg)       # old workdirs still resume
    bf = dataclasses.replace(cfg, client_compute="bfloat16")
    assert client_compute_dtype(bf) == jnp.bfloat16
    assert run_fingerprint(bf)["client_compute"] == "bfloat16"  # and differs from float32


def test_bfloat16_step_keeps_float32_params_and_stays_close():
    w = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)}

    def loss(p, b, r):
        err = b["x"] @ p["w"] - b["y"]
        return jnp.mean(err.astype(jnp.float32) ** 2), {}

    b = {"x": jnp.ones((4, 8)), "y": jnp.zeros((4, 3))}
    opt = optax.sgd(0.01)
    p32, _, _ = make_local_step(loss, opt)(w, opt.init(w), b, jax.random.key(0))
    p16, _, _ = make_local_step(loss, opt, jnp.bfloat16)(w, opt.init(w), b, jax.random.key(0))
    assert p16["w"].dtype == jnp.float32
    step32, step16 = np.asarray(p32["w"] - w["w"]), np.asarray(p16["w"] - w["w"])
    assert np.abs(step16 - step32).max() > 0                     # it did run in bf16
    np.testing.assert_allclose(step16, step32, rtol=0.05, atol=1e-3)  # bf16: 8 mantissa bits
