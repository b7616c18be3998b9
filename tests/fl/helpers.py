"""A tiny linear-regression task for engine tests (fast to compile, exact to reason about)."""
import jax.numpy as jnp
import numpy as np


def loss_fn(params, batch, rng):
    pred = batch["x"] @ params["w"] + params["b"]
    err = jnp.square(pred - batch["y"]) * batch["mask"]
    n = jnp.sum(batch["mask"])
    return jnp.sum(err) / jnp.maximum(n, 1.0), {"loss_sum": jnp.sum(err), "num_tokens": n}


def make_dataset(num_clients=24, dim=5, seed=0, min_n=3, max_n=30):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(dim,))
    data = {}
    for i in range(num_clients):
        n = int(rng.integers(min_n, max_n))
        x = rng.normal(size=(n, dim)).astype(np.float32)
        data[f"client{i:03d}"] = {"x": x, "y": (x @ w + 0.1 * rng.normal(size=n)).astype(np.float32)}
    return data


def init_params(dim=5):
    return {"w": jnp.zeros((dim,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
