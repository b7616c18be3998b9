"""Benchmark: where the CPU packed engine's gap to its single-model ceiling comes from (issue 27).

    python -m benchmarks.ceiling [--rounds 3] [--examples 16,32,64,128,256] [--models 1,2,4]
                                 [--workdir runs/bench/ceiling]

``benchmarks.round`` compares the engine (cohort 16, ``batching="packed"``: each local step is a
client's 16 sentences packed into at most 16 rows, bucketed to ``count_buckets(16)`` rows) with
ONE model taking steps on 256 rows of packed sentences (~410 sentences a step). This separates
the two things that ratio mixes, on the same cohorts of the ``so`` workload (same model, client
sizes, population and packing as ``benchmarks.round``):

* **the engine** (``CohortExecutor``, packed, one sequential lane; clip, weight, sum, noise),
  and the same engine with the loss's metric sums (``aux``: loss sum, token and example counts,
  top-1 accuracy over the vocabulary) zeroed, so XLA drops them: what the per-step training
  metrics cost (same loss, gradients and update);
* **the engine, accuracy by argmax**: the same engine whose loss counts its accuracy as
  ``argmax(logits) == target``, as ``fedpriv.models.metrics.lm_sums`` did before it took
  :func:`fedpriv.models.metrics.top1_correct` (two max-reductions; the same sums bit for bit on
  finite logits, ``tests/test_benchmarks.py``): what the argmax cost the engine;
* **one model, the engine's own steps**: the same cohorts' packed steps of 16 sentences (same
  row buckets), taken one after the other by one model (grad + SGD, nothing else): what a step of
  the client's batch costs without any federated work around it;
* **one model, steps of E sentences** for E in ``--examples`` (packed the same way, rows
  bucketed to ``count_buckets(E)``): how tokens/s grows with the examples per step;
* **one model, 256 dense rows**: ``benchmarks.round``'s packed ceiling (sentences packed 256 at
  a time, then steps of 256 full rows, ~400 sentences a step), the reference of its "% of
  ceiling";
* **M models at once** (``--models``): M models, each with its own copy of the parameters
  (stacked, as M clients hold them; they start equal and diverge after the first step),
  ``vmap``-ped, each taking the engine's 16-sentence steps: whether running several clients'
  steps as one program buys CPU throughput.

All are timed interleaved, round after round (``--rounds``), after compiling every shape. Tokens
are real (non-PAD) target tokens. Reports figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import write_results
from benchmarks.round import WORKLOADS, B, block, dense_rows, make_population, real_tokens
from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
from fedpriv.fl.client import make_local_step
from fedpriv.fl.execution import CohortExecutor
from fedpriv.fl.samplers import UniformSampler
from fedpriv.models import bucketing, metrics
from fedpriv.models.lm import LMConfig, batch_view, count_params, make_lm, make_lm_task, view_sums

ARGMAX = "engine, accuracy by argmax"


def argmax_loss(task):
    """``task.loss_fn`` (``make_lm_task``) with ``num_correct`` counted as ``argmax(logits) ==
    target`` (``lm_sums`` before issue 27): the same loss, gradient and sums."""
    def loss_fn(params, batch, rng):
        inputs, targets, packing, row_mask = batch_view(batch)
        logits = task.apply(params, inputs, batch.get("domain"), rng, **packing)
        sums = view_sums(batch, logits, targets, row_mask, batch.get("weight"))
        ex = jnp.ones(targets.shape[:1], jnp.float32) if row_mask is None else row_mask.astype(jnp.float32)
        acc_tok = metrics.in_vocab_mask(targets).astype(jnp.float32) * ex[:, None]
        hit = jnp.argmax(logits, axis=-1) == targets
        sums["num_correct"] = jnp.sum(hit.astype(jnp.float32) * acc_tok)
        return sums["loss_sum"] / jnp.maximum(sums["num_tokens"], 1.0), sums
    return loss_fn


def packed_steps(tokens: np.ndarray, per_step: int) -> list[dict]:
    """``tokens[N, T]`` cut into consecutive steps of ``per_step`` sentences, each packed
    (``bucketing.pack_sentences``) and cut to the smallest of ``count_buckets(per_step)`` rows."""
    counts = bucketing.count_buckets(per_step)
    out = []
    for i in range(0, len(tokens), per_step):
        t = np.zeros((per_step, tokens.shape[1]), tokens.dtype)
        k = len(tokens[i:i + per_step])
        t[:k] = tokens[i:i + per_step]
        m = np.zeros((per_step,), np.float32)
        m[:k] = 1.0
        p, rows = bucketing.pack_sentences(t, m)
        r = counts[bucketing.bucket_index(rows, counts)]
        out.append({f: v[:r] for f, v in p.items()})
    return out


def client_steps(data, ids, rng) -> list[dict]:
    """The engine's packed steps for a cohort: each client's sentences shuffled (as the engine's
    padded/packed batches), in steps of B = 16."""
    steps = []
    for c in ids:
        tok = data[c]["tokens"]
        steps += packed_steps(tok[rng.permutation(len(tok))], B)
    return steps


def measure(args) -> dict:
    cfg = LMConfig(**WORKLOADS["so"])
    task = make_lm_task(make_lm(cfg))
    params = task.init(jax.random.key(0))
    data = make_population(max(args.population, args.clients), cfg.vocab_size, seed=args.seed)
    ids_all = list(data)
    sampler = UniformSampler(len(ids_all), args.clients, seed=args.seed)
    cohorts = [[ids_all[i] for i in sampler.sample(r)] for r in range(args.rounds)]
    opt = optax.sgd(0.1)
    local = make_local_step(task.loss_fn, opt)
    step = jax.jit(lambda p, b: local(p, opt.init(p), b, jax.random.key(0))[0])
    vstep = jax.jit(jax.vmap(lambda p, b: local(p, opt.init(p), b, jax.random.key(0))[0]))

    def executor(loss_fn):
        alg = dp_ftrl(loss_fn, opt, server_optimizer("sgd", 1.0), clip_norm=0.5, noise_multiplier=1.0,
                      expected_cohort_size=args.clients, rounds_per_epoch=1 << 20)
        ex = CohortExecutor(alg, data, batch_size=B, capacity=args.clients, lanes=1, batching="packed")
        ex.set_params_size(params)
        return alg, ex

    def loss_without_metrics(p, batch, rng):  # the same loss and gradient; metric sums zeroed
        loss, aux = task.loss_fn(p, batch, rng)
        return loss, jax.tree_util.tree_map(jax.numpy.zeros_like, aux)

    alg, ex = executor(task.loss_fn)
    executors = {"engine": ex, "engine, training metrics zeroed": executor(loss_without_metrics)[1],
                 ARGMAX: executor(argmax_loss(task))[1]}
    state = alg.init(params, jax.random.key(1))

    def models_batches(steps, m):
        """Groups of ``m`` steps with a common row count (the largest of the group), stacked."""
        groups = []
        for i in range(0, len(steps) - len(steps) % m, m):
            g = steps[i:i + m]
            r = max(len(s["mask"]) for s in g)
            groups.append({f: np.stack([np.pad(s[f], [(0, r - len(s[f]))] + [(0, 0)] * (s[f].ndim - 1))
                                        for s in g]) for f in g[0]})
        return groups

    dense = "one model, 256 dense rows (benchmarks.round's packed ceiling)"
    paths = {"engine": None, "engine, training metrics zeroed": None, ARGMAX: None, dense: 0,
             **{f"one model, steps of {e}": e for e in args.examples},
             **{f"{m} models at once (vmap), steps of {B}": -m for m in args.models if m > 1}}
    work = {}  # path -> per round: (callable, real tokens)
    for r, ids in enumerate(cohorts):
        tok = np.concatenate([data[c]["tokens"] for c in ids])
        own = client_steps(data, ids, np.random.default_rng([args.seed, r]))
        for name, e in paths.items():
            if e is None:
                def run(ids=ids, r=r, ex=executors[name]):
                    s, _ = ex.run(state, ex.pack(ids, rng=np.random.default_rng([args.seed, r])), jax.random.key(r))
                    block(s.params)
                work.setdefault(name, []).append((run, real_tokens(data, ids)))
            elif e >= 0:
                steps = own if e == B else packed_steps(tok, e) if e else dense_rows(tok, 256)
                def run(steps=steps):
                    p = params
                    for b in steps:
                        p = step(p, b)
                    block(p)
                work.setdefault(name, []).append((run, sum(int((b["targets"] != 0).sum()) for b in steps)))
            else:
                groups = models_batches(own, -e)
                stacked = jax.tree_util.tree_map(lambda x: np.stack([x] * -e), params)
                def run(groups=groups, stacked=stacked):
                    p = stacked
                    for g in groups:
                        p = vstep(p, g)
                    block(p)
                work.setdefault(name, []).append((run, sum(int((g["targets"] != 0).sum()) for g in groups)))
    if any(e == B for e in args.examples):
        paths[f"one model, the engine's own steps ({B} sentences)"] = paths.pop(f"one model, steps of {B}")
        work[f"one model, the engine's own steps ({B} sentences)"] = work.pop(f"one model, steps of {B}")
    t0 = time.perf_counter()
    for runs in work.values():  # compile every shape
        for run, _ in runs:
            run()
    compile_s = time.perf_counter() - t0
    secs = {k: 0.0 for k in work}
    toks = {k: 0 for k in work}
    for _ in range(args.repeats):
        for r in range(args.rounds):  # interleaved
            for k, runs in work.items():
                run, n = runs[r]
                t = time.perf_counter()
                run()
                secs[k] += time.perf_counter() - t
                toks[k] += n
    rates = {k: toks[k] / secs[k] for k in work}
    top = max(v for k, v in rates.items() if k.startswith("one model"))
    return {"workload": "so", "params": count_params(params), "clients": args.clients,
            "population": max(args.population, args.clients),
            "rounds": args.rounds, "repeats": args.repeats, "device": str(jax.devices()[0]),
            "jax": jax.__version__, "cpu_count": os.cpu_count(), "compile_and_first_run_s": compile_s,
            "tokens_per_s": rates, "share_of_best_one_model": {k: v / top for k, v in rates.items()}}


def markdown(out: dict) -> str:
    r = out["tokens_per_s"]
    own = next((k for k in r if "engine's own steps" in k), None)
    dense = next((k for k in r if "dense rows" in k), None)
    lines = [f"# Packed steps: engine vs one model vs several at once (so, {out['params']:,} params, "
             f"cohort {out['clients']}, {out['device']})", "",
             f"{out['rounds']} cohorts x {out['repeats']} passes, interleaved; jax {out['jax']}", "",
             "| path | tokens/s | share of the best one-model rate |", "|---|---|---|"]
    first = [k for k in r if k.startswith("engine")] + ([own] if own else [])
    for k in first + [k for k in r if k not in first]:
        lines.append(f"| {k} | {r[k]:,.0f} | {100 * out['share_of_best_one_model'][k]:.0f}% |")
    lines.append("")
    if own:
        lines.append(f"- engine / one model on the engine's own steps: **{100 * r['engine'] / r[own]:.0f}%** "
                     "(what the federated loop around the steps costs)")
    if own and "engine, training metrics zeroed" in r:
        lines.append(f"- engine with its training metrics zeroed / one model on the engine's own steps: "
                     f"**{100 * r['engine, training metrics zeroed'] / r[own]:.0f}%**")
    if own and ARGMAX in r:
        lines.append(f"- engine with its accuracy by argmax / one model on the engine's own steps: "
                     f"**{100 * r[ARGMAX] / r[own]:.0f}%**; the engine / that: **{r['engine'] / r[ARGMAX]:.2f}x**")
    if dense:
        lines.append(f"- engine / 256 dense rows (`benchmarks.round`'s packed ceiling): "
                     f"**{100 * r['engine'] / r[dense]:.0f}%**")
    if dense and ARGMAX in r:
        lines.append(f"- engine with its accuracy by argmax / 256 dense rows: **{100 * r[ARGMAX] / r[dense]:.0f}%**")
    if own and dense:
        lines.append(f"- one model on the engine's own steps / 256 dense rows: **{100 * r[own] / r[dense]:.0f}%** "
                     "(what the client's 16-sentence steps cost against large dense ones)")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--population", type=int, default=2000, help="clients to sample cohorts from "
                    "(benchmarks.round's default)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--examples", type=ints, default=[16, 32, 64, 128, 256])
    ap.add_argument("--models", type=ints, default=[2, 4])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir")
    ap.add_argument("--from-json", help="print the table of an earlier run's ceiling.json; run nothing")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            print(markdown(json.load(f)))
        return
    out = measure(args)
    md = markdown(out)
    print(md)
    if args.workdir:
        write_results(out, md, os.path.join(args.workdir, "ceiling"))


if __name__ == "__main__":
    main()
