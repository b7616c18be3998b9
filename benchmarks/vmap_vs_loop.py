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
    ap.add_argument("--chunks", default="16,4,1",
                    help="cohort chunk sizes to time (lax.scan over vmapped chunks; 16 = plain vmap)")
    args = ap.parse_args(argv)
    C, B, L = args.clients, 16, 20
    task = make_lm_task(make_lm(LMConfig(vocab_size=args.vocab, embed_dim=96, hidden_dim=args.hidden)))
    params = task.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    data = {f"u{i}": {"tokens": rng.integers(4, args.vocab, size=(B * args.steps, L + 1)).astype(np.int32)}
            for i in range(C)}
    cohort = build_cohort(data, list(data), B, C)
    clip, z = 0.5, 1.0
    chunks = [int(c) for c in args.chunks.split(",")]
    algs = {c: dp_ftrl(task.loss_fn, optax.sgd(0.5), server_optimizer("sgd", 1.0), clip_norm=clip,
                       noise_multiplier=z, expected_cohort_size=C, rounds_per_epoch=8,
                       chunk_size=None if c >= C else c) for c in chunks}
    state0 = algs[chunks[0]].init(params, jax.random.key(1))
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

    def engine_round(c):
        def fn(state):
            s, _ = algs[c].apply(state, cohort.batches, cohort.client_mask, key)
            return s.params
        return fn

    fns = {"loop": loop_round, **{f"chunk{c}": engine_round(c) for c in chunks}}
    for fn in fns.values():
        jax.block_until_ready(fn(state0))  # compile
    times = {name: [] for name in fns}
    for _ in range(args.repeats):  # interleaved, so machine load affects every path alike
        for name, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(state0))
            times[name].append(time.perf_counter() - t)
    med = {name: float(np.median(ts)) for name, ts in times.items()}
    ref = loop_round(state0)
    max_diff = {name: max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
        jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(fns[name](state0)))) for name in fns if name != "loop"}
    out = {"clients": C, "model": f"LSTM vocab {args.vocab} hidden {args.hidden}",
           "params": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
           "local_steps": args.steps, "seconds_per_round": med,
           "loop_over_engine_ratio": {n: med["loop"] / t for n, t in med.items() if n != "loop"},
           "max_abs_param_diff_vs_loop": max_diff, "devices": [str(d) for d in jax.devices()]}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
