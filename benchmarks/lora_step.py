"""Client cost of DP federated LoRA of the public LLM (issue 53): one local step, the cache pass,
and what bfloat16 frozen weights / a bfloat16 cache move.

``python -m benchmarks.lora_step [--top-layers 1,2,4,30] [--batch 16] [--seq-len 20] [--rank 8]
[--targets wq,wv] [--repeats 3] [--out FILE.json]``

Loads SmolLM2-135M (`fedpriv.models.gguf.cached_teacher`) and, per adapted depth k (top k of 30
blocks; k = 30 is adapters on every block, no cache), times one client step — ``value_and_grad``
of `fedpriv.models.lora.LoraTask.loss_with` on a batch of B real chat-length rows (random teacher
tokens, right-padded to L+1) with the cached lower-block output, then an SGD update of the
adapters — and reports, per step: CPU seconds (``resource.getrusage``, user + system of this
process: on a machine shared with other jobs the wall clock is not a measurement) and wall
seconds (median of ``--repeats`` after a warm-up), the matmul FLOPs counted on the step's jaxpr
(`fedpriv.models.flops`) beside the closed form and XLA's own count (``cost_analysis()``, which
counts the blocks' loop body once), XLA's temporary + argument bytes
(``memory_analysis()``) and the process's peak RSS. Also: the cache pass (the lower 30 - k
blocks, per token), and the largest logit difference of bfloat16 frozen weights and of a
bfloat16 cache against float32 (on the same batch). A figure, not a test: rerun on a quiet
machine for the wall-clock numbers.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def timed(fn, repeats: int):
    """(median wall s, median CPU s) of ``fn()`` (blocking) over ``repeats`` calls after one warm-up."""
    jax.block_until_ready(fn())
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), cpu_seconds()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - w)
        cpus.append(cpu_seconds() - c)
    return statistics.median(walls), statistics.median(cpus)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top-layers", default="1,2,4,30")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=20)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--targets", default="wq,wv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frozen-dtype", default="float32", help="storage of the frozen weights in the timed steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from fedpriv.models import gguf, lora as L
    from fedpriv.models.flops import matmul_flops
    from fedpriv.public import distill
    from fedpriv.recipes.llm_lora import lora_step_flops

    c0 = cpu_seconds()
    teacher = gguf.cached_teacher()
    restriction = distill.VocabRestriction.full(teacher)
    out = {"device": str(jax.devices()[0]), "batch": args.batch, "seq_len": args.seq_len,
           "rank": args.rank, "targets": args.targets, "frozen_dtype": args.frozen_dtype,
           "teacher_load_cpu_s": cpu_seconds() - c0,
           "per_k": {}}
    rng = np.random.default_rng(0)
    B, T = args.batch, args.seq_len
    tokens = np.zeros((B, T + 1), np.int32)
    lengths = rng.integers(4, T + 2, B)  # chat-length rows: BOS + text (+ EOS), right-padded
    for i, n in enumerate(lengths):
        tokens[i, 0] = 2
        tokens[i, 1:n] = rng.integers(4, restriction.student_vocab_size, n - 1)
    batch = {"tokens": jnp.asarray(tokens), "mask": jnp.ones((B,), jnp.float32)}
    targets = tuple(args.targets.split(","))
    opt = optax.sgd(0.5)
    for k in [int(x) for x in args.top_layers.split(",")]:
        lora = L.LoraConfig(rank=args.rank, targets=targets, top_layers=k, frozen_dtype=args.frozen_dtype)
        c = cpu_seconds()
        task = L.student_vocab_task(teacher, restriction, lora)
        build_cpu = cpu_seconds() - c
        adapters = task.init(jax.random.key(0))
        hidden = L.cache_hidden(task, tokens, batch_size=B)  # warm-up + the cache for this batch
        cache_wall, cache_cpu = timed(lambda: L.cache_hidden(task, tokens, batch_size=B), args.repeats)
        real_tokens = int((tokens[:, :-1] != 0).sum())
        b = dict(batch, hidden=jnp.asarray(hidden)) if k < teacher.config.n_layers else batch

        def step(frozen, params, opt_state, bt):
            (loss, _), g = jax.value_and_grad(task.loss_with, argnums=1, has_aux=True)(frozen, params, bt)
            upd, opt_state = opt.update(g, opt_state, params)
            return optax.apply_updates(params, upd), opt_state, loss

        jstep = jax.jit(step)
        opt_state = opt.init(adapters)
        c = cpu_seconds()
        compiled = jstep.lower(task.frozen, adapters, opt_state, b).compile()
        compile_cpu = cpu_seconds() - c
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        mem = compiled.memory_analysis()
        wall, cpu = timed(lambda: compiled(task.frozen, adapters, opt_state, b), args.repeats)
        out["per_k"][k] = {
            "adapter_params": task.num_params, "upload_bytes_f32": 4 * task.num_params,
            "step_wall_s": wall, "step_cpu_s": cpu, "compile_cpu_s": compile_cpu,
            "task_build_cpu_s": build_cpu,
            "xla_flops": float(cost.get("flops", float("nan"))) if cost else None,
            "matmul_flops": matmul_flops(step, task.frozen, adapters, opt_state, b),
            "closed_form_flops": lora_step_flops(task.config, lora, B, T),
            "xla_temp_bytes": getattr(mem, "temp_size_in_bytes", None),
            "xla_argument_bytes": getattr(mem, "argument_size_in_bytes", None),
            "cache_pass_wall_s_per_token": cache_wall / real_tokens,
            "cache_pass_cpu_s_per_token": cache_cpu / real_tokens,
            "peak_rss_mb": peak_rss_mb()}
        print(json.dumps({k: out["per_k"][k]}), flush=True)
    # bfloat16 frozen weights and a bfloat16 cache vs float32 (top 2 blocks, zero adapters = the
    # base model), on real text: the first B chitchat messages in the teacher's tokens
    from fedpriv.data import load_chitchat
    from fedpriv.models import metrics
    msgs = [m for cid in load_chitchat(progress=False).client_ids[:40]
            for m in load_chitchat(progress=False)[cid]][: 4 * B]
    real_tok = np.zeros((len(msgs), T + 1), np.int32)
    for i, ids in enumerate(distill.prepare_sequences(teacher, msgs, T)):
        real_tok[i, : len(ids)] = restriction.to_student(np.asarray(ids))
        real_tok[i, 0] = metrics.BOS
    k = min(2, teacher.config.n_layers)
    mk = lambda dt: L.student_vocab_task(teacher, restriction, L.LoraConfig(  # noqa: E731
        rank=args.rank, targets=targets, top_layers=k, frozen_dtype=dt))
    f32, bf = mk("float32"), mk("bfloat16")
    ad = f32.init(jax.random.key(0))
    scores = jax.jit(lambda fz, a, bt: f32.logits_with(fz, a, bt)[0])  # (config, lora: the same)
    rb = {"tokens": jnp.asarray(real_tok), "mask": jnp.ones((len(real_tok),), jnp.float32)}
    ref = np.asarray(scores(f32.frozen, ad, dict(rb, hidden=jnp.asarray(L.cache_hidden(f32, real_tok, B)))))
    variants = {"frozen_weights": scores(bf.frozen, ad, dict(rb, hidden=jnp.asarray(L.cache_hidden(bf, real_tok, B)))),
                "cache": scores(f32.frozen, ad, dict(rb, hidden=jnp.asarray(
                    L.cache_hidden(f32, real_tok, B, dtype="bfloat16"))))}
    real = real_tok[:, 1:] != 0
    slots = np.arange(ref.shape[-1]) >= 3  # EOS and the text tokens (PAD/UNK/BOS: never predicted)
    tgt = real_tok[:, 1:]

    def nll(lg):
        lp = np.asarray(jax.nn.log_softmax(jnp.asarray(lg), -1))
        return -np.take_along_axis(lp, tgt[..., None], -1)[..., 0][real]

    n0 = nll(ref)
    out["bfloat16"] = {"tokens": int(real.sum()), "logit_std": float(ref[real][:, slots].std()),
                       "mean_nll_nats_float32": float(n0.mean())}
    for name, lg in variants.items():
        lg = np.asarray(lg)
        n1 = nll(lg)
        out["bfloat16"][name] = {"max_abs_logit_diff": float(np.abs(lg - ref)[real][:, slots].max()),
                                 "mean_abs_nll_diff_nats": float(np.abs(n1 - n0).mean()),
                                 "mean_nll_diff_nats": float(n1.mean() - n0.mean())}
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out["bfloat16"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
