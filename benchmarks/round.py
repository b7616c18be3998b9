"""Benchmark: one DP-FTRL round of the engine vs a per-client Python loop, on realistic cohorts.

    python -m benchmarks.round --workload so --clients 16 [--json] [--workdir runs/bench]

Workload ``so`` (Wang et al.'s on-device model on StackOverflow-like clients): LSTM 96/670/96 at
vocabulary 10,004 (4,050,748 parameters); client sizes ``round(lognormal(3.5, 1))`` clipped to
[1, 256] (median 33); a sentence is BOS + Geometric(mean 12.3) words + EOS, 21 tokens with
padding (L = 20); 3% of words are UNK; batch 16; one local epoch; client SGD 0.1, server SGD
1.0; DP-FTRL with clip 0.5 and z 1. ``tiny`` is the same with vocabulary 2,000 and hidden 128.

"Loop" is how a per-client simulator runs (FedJAX's default backend): a Python loop over the
cohort's clients and over each client's real batches, one jitted (grad + SGD) step per batch,
then clip, sum and noise. "Engine" is ``CohortExecutor`` + ``apply`` with the backend's
default lanes. Both see the same cohorts (the same sampled clients and shuffled batches) and
their resulting parameters are compared. Engine and loop are timed interleaved, round after
round, so machine load affects both alike. Tokens are real (non-PAD) target tokens.

``--batching padded,sorted`` (default): the first batching is the engine compared with the
loop; the others (``trimmed``, ``sorted``, ``packed``: ``fedpriv.fl.cohort`` "Length-aware
batches") run the same cohorts interleaved with it, and the report gives each one's tokens/s
(wall and CPU time: the machine may be shared), share of padded target positions,
executed/real steps, the largest parameter difference from the first batching (``trimmed`` and
``packed`` compute the same round up to float order) and share of the single-model ceiling
measured with the same trimming (length-sorted batches of 256 cut to their bucket width; for
``packed``, 256 rows of packed sentences).

Reported (``--json`` prints one object; ``--workdir`` also writes ``round.json`` and
``round.md``): ``engine_tokens_per_s``, ``loop_tokens_per_s``, ``engine_over_loop``,
``executed_over_real_steps`` (for this cohort size and, when ``--packing-cohorts`` is given, at
other sizes too), ``ceiling_tokens_per_s`` (one model, large batches of the same tokens) and
the engine's share of it, the DP noise overhead (z = 0 vs z = 1), compile times, optional
cohort scaling with peak memory (``--scaling 100,400,1000``) and teacher top-k throughput
(``--teacher``). Benchmarks report figures; they assert nothing except that engine and loop
agree.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import write_results
from configs.lm_fl import CLIENT_COMPUTE
from fedpriv.dp.clipping import clip_update
from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
from fedpriv.fl.client import make_local_step
from fedpriv.fl.execution import CohortExecutor
from fedpriv.fl.samplers import UniformSampler
from fedpriv.models.lm import LMConfig, count_params, make_lm, make_lm_task
from fedpriv.recipes.lm import client_compute_dtype

WORKLOADS = {
    "so": dict(vocab_size=10_004, embed_dim=96, hidden_dim=670),
    "tiny": dict(vocab_size=2_000, embed_dim=96, hidden_dim=128),
}
B, L, CLIP, Z = 16, 20, 0.5, 1.0


def make_population(num_clients: int, vocab: int, seed: int = 0, client_size: int | None = None) -> dict:
    """Synthetic StackOverflow-like clients: log-normal sizes (or all ``client_size`` examples:
    "full" clients), geometric sentence lengths."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(3.5, 1.0, num_clients)), 1, 256).astype(int)
    if client_size:
        sizes = np.full(num_clients, client_size)
    data = {}
    for i, n in enumerate(sizes):
        words = np.minimum(rng.geometric(1 / 12.3, n), L - 1)
        tok = np.zeros((n, L + 1), np.int32)
        ids = rng.integers(4, vocab, size=(n, L + 1))
        ids = np.where(rng.random((n, L + 1)) < 0.03, 1, ids)
        for j, w in enumerate(words):
            tok[j, 0], tok[j, 1:w + 1], tok[j, w + 1] = 2, ids[j, :w], 3
        data[f"u{i:05d}"] = {"tokens": tok}
    return data


def real_tokens(data, ids) -> int:
    return int(sum((data[c]["tokens"][:, 1:] != 0).sum() for c in ids))


class Loop:
    """A per-client Python loop over real batches (one jitted grad+SGD step per batch)."""

    def __init__(self, task, client_lr, server_lr, z, rounds_per_epoch, compute_dtype=None):
        opt = optax.sgd(client_lr)
        local = make_local_step(task.loss_fn, opt, compute_dtype)
        self.step = jax.jit(lambda p, b, k: local(p, opt.init(p), b, k)[0])
        self.clip = jax.jit(clip_update)
        self.add = jax.jit(lambda t, c: jax.tree_util.tree_map(jnp.add, t, c))
        self.server_lr = server_lr
        self.noise_alg = None

    def run(self, alg, state, data, ids, rng_np, key):
        """One round with the algorithm's own noise (applied on the loop's clipped sum)."""
        total = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        for slot, cid in enumerate(ids):
            tok = data[cid]["tokens"]
            tok = tok[rng_np.permutation(len(tok))]
            p = state.params
            ck = jax.random.fold_in(key, slot)
            for j in range(-(-len(tok) // B)):
                chunk = tok[j * B:(j + 1) * B]
                mask = np.zeros(B, np.float32)
                mask[:len(chunk)] = 1
                batch = {"tokens": np.pad(chunk, ((0, B - len(chunk)), (0, 0))), "mask": mask}
                p = self.step(p, batch, jax.random.fold_in(ck, j))
            clipped, _, _ = self.clip(jax.tree_util.tree_map(jnp.subtract, p, state.params), CLIP)
            total = self.add(total, clipped)
        return finish_round(alg, state, total)


_finish_cache = {}


def finish_round(alg, state, total):
    """Noise the loop's sum with the algorithm's mechanism and apply the server update (jitted)."""
    if id(alg) not in _finish_cache:
        # run the engine's round on an empty cohort but with the loop's sum added before noise
        dp = alg.dp
        noise = dp.privatizer(dp.noise_multiplier)  # update-only: the key is in the state

        def fin(state, total):
            unit = jax.tree_util.tree_map(lambda x: x / CLIP, total)
            noised, ns = noise.update(unit, state.noise_state)
            avg = jax.tree_util.tree_map(lambda x: x * CLIP / alg.expected_cohort_size, noised)
            params = jax.tree_util.tree_map(jnp.add, state.params, avg)
            return state.replace(params=params, noise_state=ns, round=state.round + 1)
        _finish_cache[id(alg)] = jax.jit(fin)
    return _finish_cache[id(alg)](state, total)


def log(msg: str) -> None:
    """Progress on stderr (a timed-out run still shows where its time went)."""
    print(f"[benchmarks.round {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def block(x):
    jax.block_until_ready(x)
    return x


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                             jax.tree_util.tree_leaves(b)))


def peak_memory_bytes() -> int | None:
    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # CPU: process max RSS


def dense_rows(tokens: np.ndarray, rows: int) -> list[dict]:
    """Sentences packed ``rows`` at a time (``bucketing.pack_sentences``), the rows concatenated
    and cut into steps of ``rows`` full rows (a partial last step dropped, unless it is the only
    one): the packed ceiling's steps."""
    from fedpriv.models import bucketing
    parts = [bucketing.pack_sentences(tokens[i:i + rows], np.ones(len(tokens[i:i + rows]), np.float32))
             for i in range(0, len(tokens), rows)]
    flat = {k: np.concatenate([p[k][:r] for p, r in parts]) for k in parts[0][0]}
    m = len(flat["mask"]) // rows * rows or len(flat["mask"])
    return [{k: v[i:i + rows] for k, v in flat.items()} for i in range(0, m, min(rows, m))]


def ceiling(task, params, data, ids, batch=256, repeats=2, trim=False, compute_dtype=None,
            pack=False) -> float:
    """Tokens/s of ONE model taking grad+SGD steps on large batches of the same examples.

    ``trim``: the examples sorted by length, each batch cut to its bucket width
    (``bucketing.width_buckets``), as the engine's length-aware batches; every width is
    compiled before timing. ``pack``: the examples packed end to end into rows
    (``bucketing.pack_sentences``, ``batch`` examples at a time), batches of ``batch`` rows."""
    tok = np.concatenate([data[c]["tokens"] for c in ids])
    n = len(tok) // batch * batch or len(tok)
    batch = min(batch, n)
    opt = optax.sgd(0.1)
    local = make_local_step(task.loss_fn, opt, compute_dtype)
    step = jax.jit(lambda p, b: local(p, opt.init(p), b, jax.random.key(0))[0])
    if pack:
        batches = dense_rows(tok, batch)
        real = sum(int((b["targets"] != 0).sum()) for b in batches)
    elif trim:
        from fedpriv.models import bucketing
        tok = tok[np.argsort(bucketing.row_lengths(tok), kind="stable")][:n]
        widths = bucketing.width_buckets(tok.shape[1])
        batches = []
        for i in range(0, n, batch):
            t = tok[i:i + batch]
            w = widths[bucketing.bucket_index(int(bucketing.row_lengths(t).max()), widths)]
            batches.append({"tokens": t[:, :w], "mask": np.ones(batch, np.float32)})
    else:
        batches = [{"tokens": tok[i:i + batch], "mask": np.ones(batch, np.float32)} for i in range(0, n, batch)]
    if not pack:
        real = float((tok[:n, 1:] != 0).sum())
    for w in {np.shape(next(iter(b.values()))): b for b in batches}.values():
        p = block(step(params, w))
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        for b in batches:
            p = step(p, b)
        block(p)
        best = min(best, time.perf_counter() - t)
    return real / best


def measure(args) -> dict:
    cfg = LMConfig(**WORKLOADS[args.workload], arch=args.arch)
    task = make_lm_task(make_lm(cfg))
    params = task.init(jax.random.key(0))
    population = max(args.population, args.clients)
    data = make_population(population, cfg.vocab_size, seed=args.seed, client_size=args.client_size)
    dtype = client_compute_dtype(args.compute_dtype)
    ids_all = list(data)
    sampler = UniformSampler(population, args.clients, seed=args.seed)

    def algorithm(z):
        return dp_ftrl(task.loss_fn, optax.sgd(0.1), server_optimizer("sgd", 1.0), clip_norm=CLIP,
                       noise_multiplier=z, expected_cohort_size=args.clients, rounds_per_epoch=1 << 20,
                       compute_dtype=dtype)

    alg, alg0 = algorithm(Z), algorithm(0.0)
    ex = CohortExecutor(alg, data, batch_size=B, capacity=args.clients, lanes=args.lanes,
                        batching=args.batching[0])
    # the same engine with the other batchings, timed interleaved with it (same cohorts)
    ex_b = {b: CohortExecutor(alg, data, batch_size=B, capacity=args.clients, lanes=args.lanes,
                              batching=b) for b in args.batching[1:]}
    ex0 = CohortExecutor(alg0, data, batch_size=B, capacity=args.clients, lanes=args.lanes)
    ex.set_params_size(params)
    ex0.set_params_size(params)
    loop = Loop(task, 0.1, 1.0, Z, None, compute_dtype=dtype)
    state = alg.init(params, jax.random.key(1))
    cohorts = [[ids_all[i] for i in sampler.sample(r)] for r in range(args.rounds)]

    # compile (timed) on the first cohort
    t = time.perf_counter()
    packed = ex.pack(cohorts[0], rng=np.random.default_rng([args.seed, 0]))
    s_eng, _ = ex.run(state, packed, jax.random.key(5))
    block(s_eng.params)
    compile_engine = time.perf_counter() - t
    t = time.perf_counter()
    s_loop = block(loop.run(alg, state, data, cohorts[0], np.random.default_rng([args.seed, 0]),
                            jax.random.key(5)).params)
    compile_loop = time.perf_counter() - t
    log(f"compiled: engine {compile_engine:.1f} s, loop {compile_loop:.1f} s")
    agree = max_diff(s_eng.params, s_loop)
    s0, _ = ex0.run(alg0.init(params, jax.random.key(1)), packed, jax.random.key(5))
    block(s0.params)
    ex.real_steps = ex.executed_steps = 0

    # steady state: compile every lane shape these cohorts need first (a run reuses them)
    t = time.perf_counter()
    for r, ids in enumerate(cohorts):
        for e in (ex, ex0):
            p = e.pack(ids, rng=np.random.default_rng([args.seed, r]))
            block(e.run(e.algorithm.init(params, jax.random.key(1)), p, jax.random.key(r))[0].params)
    warmup = time.perf_counter() - t
    log(f"warm-up (other lane shapes, z=0): {warmup:.1f} s")
    for b, e in ex_b.items():  # compile every width / lane shape of the other batchings
        for r, ids in enumerate(cohorts):
            block(e.run(state, e.pack(ids, rng=np.random.default_rng([args.seed, r])), jax.random.key(r))[0].params)
    ex.real_steps = ex.executed_steps = ex.executed_positions = ex.real_positions = 0
    for e in ex_b.values():
        e.real_steps = e.executed_steps = e.executed_positions = e.real_positions = 0
    times = {"engine": [], "engine_host_pack": [], "loop": [], "engine_z0": [], "engine_cpu": [],
             **{f"engine_{b}": [] for b in ex_b}, **{f"engine_{b}_cpu": [] for b in ex_b}}
    diffs = {b: 0.0 for b in ex_b}
    tokens = 0
    for r, ids in enumerate(cohorts):  # interleaved: engine, loop, engine without noise, batchings
        tokens += real_tokens(data, ids)
        rng_seed = [args.seed, r]
        t, c = time.perf_counter(), time.process_time()
        packed = ex.pack(ids, rng=np.random.default_rng(rng_seed))
        times["engine_host_pack"].append(time.perf_counter() - t)
        s, _ = ex.run(state, packed, jax.random.key(r))
        block(s.params)
        times["engine"].append(time.perf_counter() - t)
        times["engine_cpu"].append(time.process_time() - c)
        for b, e in ex_b.items():
            t, c = time.perf_counter(), time.process_time()
            sb, _ = e.run(state, e.pack(ids, rng=np.random.default_rng(rng_seed)), jax.random.key(r))
            block(sb.params)
            times[f"engine_{b}"].append(time.perf_counter() - t)
            times[f"engine_{b}_cpu"].append(time.process_time() - c)
            diffs[b] = max(diffs[b], max_diff(sb.params, s.params))
        t = time.perf_counter()
        block(loop.run(alg, state, data, ids, np.random.default_rng(rng_seed), jax.random.key(r)).params)
        times["loop"].append(time.perf_counter() - t)
        t = time.perf_counter()
        s, _ = ex0.run(alg0.init(params, jax.random.key(1)), ex0.pack(ids, rng=np.random.default_rng(rng_seed)),
                       jax.random.key(r))
        block(s.params)
        times["engine_z0"].append(time.perf_counter() - t)
        log(f"round {r}: engine {times['engine'][-1]:.3f} s, loop {times['loop'][-1]:.3f} s")
    eng, lp, e0 = (sum(times[k]) for k in ("engine", "loop", "engine_z0"))
    out = {
        "workload": args.workload, "arch": args.arch, "params": count_params(params),
        "clients": args.clients, "rounds_timed": args.rounds, "lanes": ex.lanes,
        "client_size": args.client_size or "lognormal(3.5, 1) clipped to [1, 256]",
        "compute_dtype": args.compute_dtype, "jax": jax.__version__,
        "device": str(jax.devices()[0]), "backend": jax.default_backend(),
        "real_tokens_per_round": tokens / args.rounds,
        "engine_seconds_per_round": eng / args.rounds, "loop_seconds_per_round": lp / args.rounds,
        "engine_tokens_per_s": tokens / eng, "loop_tokens_per_s": tokens / lp,
        "engine_over_loop": lp / eng,
        "executed_over_real_steps": ex.executed_over_real,
        "real_steps_per_round": ex.real_steps / args.rounds,
        "noise_overhead": eng / e0 - 1.0,
        "host_pack_share": sum(times["engine_host_pack"]) / eng,
        "compile_seconds": {"engine": compile_engine, "loop": compile_loop,
                            "engine_other_shapes_and_z0": warmup},
        "max_abs_param_diff_engine_vs_loop": agree,
        "per_round_seconds": times,
    }

    def positions(e):
        return {"padded_position_share": 1.0 - e.real_positions / e.executed_positions
                if e.executed_positions else math.nan,
                "executed_over_real_steps": e.executed_over_real}
    out["batching"] = {args.batching[0]: {"tokens_per_s": tokens / eng,
                                          "cpu_seconds_per_round": sum(times["engine_cpu"]) / args.rounds,
                                          **positions(ex)}}
    for b, e in ex_b.items():
        tb, cb = sum(times[f"engine_{b}"]), sum(times[f"engine_{b}_cpu"])
        out["batching"][b] = {"tokens_per_s": tokens / tb, "cpu_seconds_per_round": cb / args.rounds,
                              "over_first": eng / tb,
                              "cpu_over_first": sum(times["engine_cpu"]) / cb,
                              "max_abs_param_diff_vs_first": diffs[b], **positions(e)}
    pad_steps = []
    for k in args.packing_cohorts:
        s = UniformSampler(population, min(k, population), seed=args.seed)
        real = executed = padded = 0
        for r in range(5):
            ids = [ids_all[i] for i in s.sample(r)]
            p = ex.pack(ids)
            steps = [-(-len(data[c]["tokens"]) // B) for c in ids]
            real += p.real_steps
            executed += p.executed_steps
            padded += len(ids) * (1 << (max(steps) - 1).bit_length())  # yesterday's pow2 padding
        pad_steps.append({"clients": k, "executed_over_real_steps": executed / real,
                          "padded_over_real_steps": padded / real})
    out["packing"] = pad_steps
    if args.ceiling:
        ids = cohorts[0]
        c = ceiling(task, params, data, ids, compute_dtype=dtype)
        out["ceiling_tokens_per_s"] = c
        out["engine_share_of_ceiling"] = out["engine_tokens_per_s"] / c
        same = {"padded": c}
        if any(b in ("trimmed", "sorted") for b in args.batching):
            same["trimmed"] = same["sorted"] = ct = ceiling(task, params, data, ids, trim=True,
                                                            compute_dtype=dtype)
            out["ceiling_trimmed_tokens_per_s"] = ct
        if "packed" in args.batching:
            same["packed"] = cp = ceiling(task, params, data, ids, pack=True, compute_dtype=dtype)
            out["ceiling_packed_tokens_per_s"] = cp
        for b, row in out["batching"].items():
            row["share_of_ceiling"] = row["tokens_per_s"] / same[b]
    if args.scaling:
        rows = []
        for k in args.scaling:
            s = UniformSampler(population, min(k, population), seed=args.seed + 1)
            a = algorithm(Z)
            e = CohortExecutor(a, data, batch_size=B, capacity=k, lanes=args.lanes, batching=args.batching[0])
            e.set_params_size(params)
            ids = [ids_all[i] for i in s.sample(0)]
            st = a.init(params, jax.random.key(1))
            block(e.run(st, e.pack(ids), jax.random.key(0))[0].params)
            t = time.perf_counter()
            block(e.run(st, e.pack(ids), jax.random.key(1))[0].params)
            dt = time.perf_counter() - t
            rows.append({"clients": k, "seconds_per_round": dt,
                         "tokens_per_s": real_tokens(data, ids) / dt, "peak_memory_bytes": peak_memory_bytes()})
        out["scaling"] = rows
    if args.teacher:
        from fedpriv.models import gguf
        from fedpriv.public import distill
        teacher = gguf.load_teacher()
        ids = np.random.default_rng(0).integers(0, teacher.config.vocab_size, (args.teacher_batch, L + 1))
        fn = distill._topk_fn(teacher, 10)
        t = time.perf_counter()
        block(fn(ids, np.ones_like(ids, np.float32)))
        first = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(2):
            block(fn(ids, np.ones_like(ids, np.float32)))
        out["teacher_topk_tokens_per_s"] = ids.size * 2 / (time.perf_counter() - t)
        out["compile_seconds"]["teacher"] = first
    out["peak_memory_bytes"] = peak_memory_bytes()
    return out


def markdown(out: dict) -> str:
    lines = [f"# Round benchmark: {out['workload']} ({out['arch']}, {out['params']:,} params), "
             f"cohort {out['clients']}, {out['device']}", "",
             f"client sizes: {out['client_size']}; client compute {out['compute_dtype']}; jax {out['jax']}", "",
             "| path | s/round | tokens/s |", "|---|---|---|",
             f"| engine (lanes={out['lanes']}) | {out['engine_seconds_per_round']:.3f} | "
             f"{out['engine_tokens_per_s']:,.0f} |",
             f"| per-client loop | {out['loop_seconds_per_round']:.3f} | {out['loop_tokens_per_s']:,.0f} |", "",
             f"- engine / loop: **{out['engine_over_loop']:.2f}x**; executed / real local steps: "
             f"{out['executed_over_real_steps']:.3f}; engine vs loop max |param diff| "
             f"{out['max_abs_param_diff_engine_vs_loop']:.2e}",
             f"- DP noise overhead (z=1 vs z=0): {100 * out['noise_overhead']:+.1f}%; host-side "
             f"packing: {100 * out['host_pack_share']:.1f}% of the engine's round",
             "- compile: " + ", ".join(f"{k} {v:.1f} s" for k, v in out["compile_seconds"].items())]
    if "ceiling_tokens_per_s" in out:
        lines.append(f"- single-model ceiling (batch 256): {out['ceiling_tokens_per_s']:,.0f} tokens/s; "
                     f"engine at {100 * out['engine_share_of_ceiling']:.0f}%")
    if out.get("batching"):
        lines += ["", "| batching (same cohorts, interleaved) | tokens/s | CPU s/round | vs first (wall / CPU) "
                  "| padded positions | executed/real steps | % of ceiling (same trimming) "
                  "| max |param diff| vs first |", "|---|---|---|---|---|---|---|---|"]
        for b, r in out["batching"].items():
            lines.append(f"| {b} | {r['tokens_per_s']:,.0f} | {r['cpu_seconds_per_round']:.3f} | "
                         f"{r.get('over_first', 1.0):.2f}x / {r.get('cpu_over_first', 1.0):.2f}x | "
                         f"{100 * r['padded_position_share']:.1f}% | {r['executed_over_real_steps']:.3f} | "
                         + (f"{100 * r['share_of_ceiling']:.0f}% | " if "share_of_ceiling" in r else "- | ")
                         + (f"{r['max_abs_param_diff_vs_first']:.1e} |"
                            if "max_abs_param_diff_vs_first" in r else "- |"))
        if "ceiling_trimmed_tokens_per_s" in out:
            lines.append(f"- single-model ceiling, length-sorted batches trimmed to their bucket: "
                         f"{out['ceiling_trimmed_tokens_per_s']:,.0f} tokens/s")
        if "ceiling_packed_tokens_per_s" in out:
            lines.append(f"- single-model ceiling, 256 rows of packed sentences: "
                         f"{out['ceiling_packed_tokens_per_s']:,.0f} tokens/s")
    if "teacher_topk_tokens_per_s" in out:
        lines.append(f"- teacher top-k: {out['teacher_topk_tokens_per_s']:,.0f} tokens/s")
    if out.get("packing"):
        lines += ["", "| cohort | executed/real steps (engine) | padded/real (pow2 padding) |", "|---|---|---|"]
        lines += [f"| {p['clients']} | {p['executed_over_real_steps']:.3f} | {p['padded_over_real_steps']:.2f} |"
                  for p in out["packing"]]
    if out.get("scaling"):
        lines += ["", "| cohort | s/round | tokens/s | peak memory (GiB) |", "|---|---|---|---|"]
        lines += [f"| {s['clients']} | {s['seconds_per_round']:.3f} | {s['tokens_per_s']:,.0f} | "
                  f"{s['peak_memory_bytes'] / 2**30:.2f} |" for s in out["scaling"]]
    return "\n".join(lines) + "\n"


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="so")
    ap.add_argument("--arch", choices=("lstm", "transformer"), default="lstm")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--population", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (each a new cohort)")
    ap.add_argument("--lanes", default="auto")
    ap.add_argument("--batching", type=lambda t: t.split(","), default=["padded", "sorted"],
                    help="comma list: the first is the engine compared with the loop; the others "
                         "run the same cohorts interleaved (tokens/s, padded positions, ceiling)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--client-size", type=int, default=None,
                    help="every client holds this many examples (e.g. 256: full clients); "
                         "default log-normal sizes")
    ap.add_argument("--compute-dtype", choices=CLIENT_COMPUTE, default="float32",
                    help="client forward/backward precision (engine, loop and ceiling alike)")
    ap.add_argument("--packing-cohorts", type=_ints, default=[16, 100])
    ap.add_argument("--scaling", type=_ints, default=[])
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false")
    ap.add_argument("--teacher", action="store_true")
    ap.add_argument("--teacher-batch", type=int, default=32)
    ap.add_argument("--workdir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.rounds < 1 or (args.client_size is not None and not 1 <= args.client_size <= 256):
        print("error: --clients and --rounds must be >= 1, --client-size in [1, 256]", file=sys.stderr)
        return 2
    out = measure(args)
    md = markdown(out)
    if args.workdir:
        write_results(out, md, os.path.join(args.workdir, "round"))
    print(json.dumps(out) if args.json else md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
