"""Benchmark: one vmapped DP-FTRL round vs a per-client Python loop (identical results).

    python -m benchmarks.vmap_vs_loop [--clients 16] [--repeats 5]

Both paths use the same jitted client update, clipping and tree noise; the loop calls the
per-client update once per client from Python and sums on the host side of the jit boundary.
Reports the median wall-clock per round and checks the two rounds' parameters agree.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.dp.clipping import clip_update
from fedpriv.dp.noise import tree_mechanism
from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
from fedpriv.fl.client import make_client_update
from fedpriv.fl.cohort import build_cohort
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    C, B, L = args.clients, 16, 20
    task = make_lm_task(make_lm(LMConfig(vocab_size=args.vocab, embed_dim=96, hidden_dim=args.hidden)))
    params = task.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    data = {f"u{i}": {"tokens": rng.integers(4, args.vocab, size=(B * args.steps, L + 1)).astype(np.int32)}
            for i in range(C)}
    cohort = build_cohort(data, list(data), B, C)
    clip, z = 0.5, 1.0
    alg = dp_ftrl(task.loss_fn, optax.sgd(0.5), server_optimizer("sgd", 1.0), clip_norm=clip,
                  noise_multiplier=z, expected_cohort_size=C, rounds_per_epoch=8)
    state0 = alg.init(params, jax.random.key(1))
    key = jax.random.key(2)

    # --- per-client Python loop with the same math
    upd = jax.jit(make_client_update(task.loss_fn, optax.sgd(0.5)))
    mech = tree_mechanism(z, 1.0, 8)
    noise = jax.jit(mech.add_noise)
    clip_j = jax.jit(clip_update)

    def loop_round(state):
        total = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        for k in range(C):
            b = jax.tree_util.tree_map(lambda a: a[k], cohort.batches)
            delta, _, _ = upd(state.params, b, jax.random.fold_in(key, k))
            clipped, _, _ = clip_j(delta, clip)
            total = jax.tree_util.tree_map(jnp.add, total, clipped)
        unit = jax.tree_util.tree_map(lambda x: x / clip, total)
        noised, _ = noise(unit, state.noise_state)
        avg = jax.tree_util.tree_map(lambda x: x * clip / C, noised)
        return jax.tree_util.tree_map(jnp.add, state.params, avg)

    def vmap_round(state):
        s, _ = alg.apply(state, cohort.batches, cohort.client_mask, key)
        return s.params

    def timeit(fn):
        jax.block_until_ready(fn(state0))  # compile
        ts = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(state0))
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    t_loop, t_vmap = timeit(loop_round), timeit(vmap_round)
    a, b = loop_round(state0), vmap_round(state0)
    max_diff = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                                  jax.tree_util.tree_leaves(b)))
    out = {"clients": C, "model": f"LSTM vocab {args.vocab} hidden {args.hidden}",
           "params": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
           "local_steps": args.steps, "loop_s_per_round": t_loop, "vmap_s_per_round": t_vmap,
           "speedup": t_loop / t_vmap, "max_abs_param_diff": max_diff,
           "devices": [str(d) for d in jax.devices()]}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
