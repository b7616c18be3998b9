"""Generation throughput of the public LLM: KV-cache sampling vs the no-cache reference.

``python -m benchmarks.generate [--prompts 64] [--batch-size 32] [--max-new 32] [--out DIR]``

Three paths continue the same chat prompts (SmolLM2-135M-Instruct, `fedpriv.models.generate`;
one instruction, as PrE-Text batches the rows of one instruction) with the same keys: no cache
(every step a full forward over the buffer), the KV cache, and the KV cache with the chat
template as a shared prefix prefilled once per batch (how `fedpriv.synth.evolve` runs). Each is
run once untimed (compile), then timed, interleaved. Reports generated tokens/s (no stop token: every row generates
``max_new``) and the ratio; writes ``generate.json`` / ``generate.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax

from fedpriv.models import generate as G
from fedpriv.models.gguf import load_teacher
from fedpriv.synth.evolve import chat_prompt

INSTRUCTIONS = ("Write a short, casual text message to a friend.",
                "Reply to a friend who asked how your weekend was.",
                "Ask a friend a question about their plans.",
                "Write one line of small talk.")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--out", default="runs/bench/generate")
    a = ap.parse_args(argv)
    teacher = load_teacher()
    prompt = chat_prompt(teacher, INSTRUCTIONS[0])
    prompts = [prompt] * a.prompts
    key = jax.random.key(0)
    kw = dict(max_new=a.max_new, temperature=1.0, top_k=50, batch_size=a.batch_size)
    runs = {
        "kv_cache": lambda: G.generate(teacher, prompts, key, stop_ids=(), **kw),
        "no_cache": lambda: G.generate_nocache(teacher, prompts, key, **kw),
        "kv_cache_shared_prefix": lambda: G.generate(teacher, [prompt[-1:]] * a.prompts, key,
                                                     stop_ids=(), prefix=prompt[:-1], **kw),
    }
    small = prompts[: a.batch_size]
    G.generate(teacher, small, key, stop_ids=(), **kw)  # compile both paths
    G.generate_nocache(teacher, small, key, **kw)
    G.generate(teacher, [prompt[-1:]] * len(small), key, stop_ids=(), prefix=prompt[:-1], **kw)
    secs = {k: [] for k in runs}
    for name in ("kv_cache", "kv_cache_shared_prefix", "no_cache", "kv_cache_shared_prefix", "kv_cache"):
        t0 = time.perf_counter()
        out = runs[name]()
        secs[name].append(time.perf_counter() - t0)
        assert sum(len(o) for o in out) == a.prompts * a.max_new
    tokens = a.prompts * a.max_new
    res = {"prompts": a.prompts, "batch_size": a.batch_size, "max_new": a.max_new,
           "prompt_tokens": sum(len(p) for p in prompts), "device": str(jax.devices()[0]),
           "jax": jax.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
           "seconds": secs,
           "tokens_per_s": {k: tokens / min(v) for k, v in secs.items()}}
    res["speedup"] = {k: res["tokens_per_s"][k] / res["tokens_per_s"]["no_cache"] for k in runs}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "generate.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = (f"# Generation throughput ({res['device']}, jax {res['jax']})\n\n"
          f"{a.prompts} chat prompts ({res['prompt_tokens']} prompt tokens), batch {a.batch_size}, "
          f"{a.max_new} new tokens each, top-k 50, temperature 1; best of the timed runs "
          "(interleaved)\n\n| path | tokens/s | seconds |\n|---|---|---|\n"
          + "".join(f"| {k} | {res['tokens_per_s'][k]:,.0f} | {min(secs[k]):.1f} |\n" for k in runs)
          + "\n" + "; ".join(f"{k} / no_cache: **{v:.2f}x**" for k, v in res["speedup"].items()
                               if k != "no_cache") + "\n")
    with open(os.path.join(a.out, "generate.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
