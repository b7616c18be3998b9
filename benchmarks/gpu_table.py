"""One Markdown table of ``benchmarks.round --json`` results (e.g. benchmarks/gpu_suite.sh's).

    python -m benchmarks.gpu_table runs/bench/gpu/*.json
"""
from __future__ import annotations

import json
import os
import sys


def row(name: str, r: dict) -> str:
    ceil = r.get("engine_share_of_ceiling")
    return (f"| {name} | {r['arch']} | {r['clients']} | {r['client_size']} | {r['compute_dtype']} | "
            f"{r['lanes']} | {r['engine_seconds_per_round']:.3f} | {r['loop_seconds_per_round']:.3f} | "
            f"**{r['engine_over_loop']:.2f}x** | {r['engine_tokens_per_s']:,.0f} | "
            + (f"{100 * ceil:.0f}% |" if ceil is not None else "- |")
            + f" {r['executed_over_real_steps']:.3f} | {r['compile_seconds']['engine']:.1f} | "
            f"{r['max_abs_param_diff_engine_vs_loop']:.1e} |")


def main(paths) -> int:
    lines = ["| case | arch | cohort | client sizes | client compute | lanes | engine s/round | "
             "loop s/round | engine/loop | engine tokens/s | % of ceiling | executed/real steps | "
             "engine compile s | max param diff |", "|" + "---|" * 14]
    device = None
    for p in paths:
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            lines.append(f"| {os.path.basename(p)} | no result ({type(e).__name__}) |" + " |" * 12)
            continue
        device = device or f"{r['device']} (jax {r.get('jax')})"
        lines.append(row(os.path.basename(p).removesuffix(".json"), r))
    print(f"device: {device}\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
