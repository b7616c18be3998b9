"""The public LLM as the on-device model (issue 53): DP-FTRL LoRA fine-tuning of SmolLM2-135M vs
the small LM trained with its help (public pre-training + distillation) vs the LLM zero-shot,
at equal epsilon (and equal upload), on chitchat's users, in bits per byte.

At each epsilon of the config (Wang et al.'s per-round noise, labelled 1.77 / 18.71; the
simulated and the spent epsilon reported, the same for every private arm), per seed: (a) the
small LSTM of wang-table2's best row, (b) LoRA adapters on the top blocks of the public LLM,
(b=) adapters sized to (a)'s upload, (c) the LLM zero-shot. Bits per byte and next-token
accuracy on the private test users (one test set for every arm), the unigram and
most-frequent-token baselines, each arm's client cost per round (FLOPs, peak memory, bytes down
and up) and the rounds each needs to reach a target validation bits per byte; verdicts per
`fedpriv.verdicts` (paired by seed).

    python -m experiments.llm_lora --config configs/llm_lora.py:small
"""
from __future__ import annotations

import os

import numpy as np

from experiments import common
from fedpriv import verdicts as V
from fedpriv.recipes import llm_lora as R
from fedpriv.report import plot_curves

PERCENT = 100


def rounds_to(curve, round0: float | None, target: float) -> int | None:
    """The first round whose validation bits per byte is at or below ``target``: 0 when the
    start already is, None when no evaluated round reaches it (censored at the run's rounds)."""
    if round0 is not None and round0 <= target:
        return 0
    return next((int(r) for r, v in sorted(curve or ()) if v <= target), None)


def _targets(cfg, runs) -> dict:
    """(seed, eps) -> the target validation bits per byte: ``cfg.target_bpb`` or (a)'s final."""
    out = {}
    for r in runs:
        if r["arm"] == "small_lm" and r.get("val_curve"):
            out[(r["seed"], r["target_epsilon"])] = cfg.target_bpb or sorted(r["val_curve"])[-1][1]
    return out


def per_run_rows(cfg, runs) -> list[dict]:
    """One row per run, with its rounds to the target (zero-shot: one row per (seed, eps))."""
    targets = _targets(cfg, runs)
    zero = next((r for r in runs if r["arm"] == "zero_shot"), None)
    rows = []
    for r in runs:
        if r["arm"] == "zero_shot":
            continue
        target = targets.get((r["seed"], r["target_epsilon"]), cfg.target_bpb)
        need = None if target is None else rounds_to(r.get("val_curve"), r["val_round0"]["bits_per_byte"], target)
        rows.append({"arm": r["arm"], "seed": r["seed"], "epsilon": r["target_epsilon"],
                     "test_bpb": r["test"]["bits_per_byte"], "test_accuracy": r["test"]["accuracy"],
                     "test_common_accuracy": r["test"].get("common_accuracy"),
                     "val_bpb_round0": r["val_round0"]["bits_per_byte"],
                     "val_bpb_final": sorted(r["val_curve"])[-1][1] if r.get("val_curve") else None,
                     "target_val_bpb": target, "rounds_to_target": need, "rounds": r["rounds"],
                     "epsilon_charged": r["epsilon"], "epsilon_executed_run": r.get("epsilon_executed_run"),
                     "noise_multiplier": r["noise_multiplier"], "server_lr": r["server_lr"],
                     "cpu_s": r.get("cpu_s"), "wall_s": r.get("wall_clock_s")})
    if zero is not None:
        for seed in cfg.lm.seeds:
            for eps in cfg.lm.epsilons:
                target = targets.get((seed, eps), cfg.target_bpb)
                rows.append({"arm": "zero_shot", "seed": seed, "epsilon": eps,
                             "test_bpb": zero["test"]["bits_per_byte"], "test_accuracy": zero["test"]["accuracy"],
                             "test_common_accuracy": zero["test"].get("common_accuracy"),
                             "val_bpb_round0": zero["val"]["bits_per_byte"],
                             "val_bpb_final": zero["val"]["bits_per_byte"],
                             "target_val_bpb": target,
                             "rounds_to_target": (None if target is None else
                                                  0 if zero["val"]["bits_per_byte"] <= target else None),
                             "rounds": 0, "epsilon_charged": 0.0})
    return rows


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.3g}"


def aggregate(cfg, out: dict, rows: list[dict]) -> list[dict]:
    base = out["baselines"]["test"]
    costs = {r["arm"]: r.get("costs") or {} for r in out["runs"]}
    table = []
    for eps in cfg.lm.epsilons:
        for arm in cfg.arms:
            rs = [r for r in rows if r["arm"] == arm and r["epsilon"] == eps]
            if not rs:
                continue
            c = costs.get(arm, {})
            need = [r["rounds_to_target"] for r in rs]
            table.append({
                "epsilon": eps, "arm": R.ARM_LABELS[arm],
                "test bits/byte": common.pm([r["test_bpb"] for r in rs], 1, 4),
                "test accuracy (%)": common.pm([r["test_accuracy"] for r in rs], PERCENT),
                "test accuracy, common targets (%)": common.pm([r["test_common_accuracy"] for r in rs], PERCENT),
                "unigram bits/byte": round(base["unigram_bits_per_byte"], 4),
                "most-frequent (%)": round(PERCENT * (base["most_frequent_accuracy_small"] if arm == "small_lm"
                                                      else base["most_frequent_accuracy_llm"]), 2),
                "most-frequent, common (%)": round(PERCENT * base["most_frequent_accuracy_common"], 2),
                "epsilon charged": round(max(r["epsilon_charged"] for r in rs), 3),
                "params up": c.get("params"),
                "MB down/up per round": f"{_mb(c.get('down_bytes'))}/{_mb(c.get('up_bytes'))}",
                "client GFLOP per round": None if not c.get("flops") else round(c["flops"] / 1e9, 2),
                "rounds to target": "/".join("-" if n is None else str(n) for n in need),
                "seeds": len(rs)})
    return table


def cost_table(cfg, out: dict, rows: list[dict]) -> list[dict]:
    """Per arm: the client's cost per round (closed-form FLOPs, XLA's peak bytes of a step,
    bytes down/up), the measured CPU seconds per round of this CPU (the runs' training phase) and
    the server's rounds to reach the target validation bits per byte at each epsilon (per seed,
    '-': not within the run; ``per_run_rows``)."""
    table = []
    for arm in cfg.arms:
        rs = [r for r in out["runs"] if r["arm"] == arm]
        if not rs:
            continue
        c = rs[0].get("costs") or {}
        train_cpu = [sum(v["cpu"] for k, v in (r.get("phase_seconds") or {}).items() if k.startswith(("training",
                     "public pre-training"))) / max(r.get("rounds") or 1, 1) for r in rs if r.get("phase_seconds")]
        cache_cpu = [sum(v["cpu"] for k, v in (r.get("phase_seconds") or {}).items() if k.startswith("cache pass"))
                     for r in rs if r.get("phase_seconds")]
        table.append({
            "arm": R.ARM_LABELS[arm], "trainable params (upload)": c.get("params"),
            "model on the device (MB, one-time download)": _mb(c.get("model_bytes")),
            "MB down per round": _mb(c.get("down_bytes")), "MB up per round": _mb(c.get("up_bytes")),
            "local steps": c.get("local_steps"),
            "GFLOP per client-round (closed form)": None if not c.get("flops") else round(c["flops"] / 1e9, 3),
            "cache pass GFLOP per example (once)": (None if not c.get("cache_flops_per_example")
                                                      else round(c["cache_flops_per_example"] / 1e9, 3)),
            "peak MB of a client step (XLA)": _mb(c.get("step_peak_bytes")),
            "CPU s per round (measured, incl. compiles)": (None if not train_cpu else
                                                           common.pm(train_cpu, 1, 2)),
            "CPU s of the cache pass (measured)": None if not cache_cpu or not max(cache_cpu) else
            common.pm(cache_cpu, 1, 1),
            **{f"rounds to target, eps {e:g} (per seed)": "/".join(
                "-" if r["rounds_to_target"] is None else str(r["rounds_to_target"])
                for r in sorted((r for r in rows if r["arm"] == arm and r["epsilon"] == e), key=lambda r: r["seed"]))
               for e in cfg.lm.epsilons},
            "runs": len(rs)})
    return table


def verdicts(cfg, out: dict, rows: list[dict]) -> list:
    """The issue's claims per epsilon, paired by seed; trivial baselines: the unigram's bits per
    byte, the most-frequent-token accuracy on the common targets."""
    base = out["baselines"]["test"]
    uni = base["unigram_bits_per_byte"]
    mf = PERCENT * base["most_frequent_accuracy_common"]
    val = {}
    for r in rows:
        val.setdefault((r["epsilon"], r["arm"]), {})[r["seed"]] = r
    params = {r["arm"]: (r.get("costs") or {}).get("params") for r in out["runs"]}
    L = R.ARM_LABELS
    res = []
    for eps in cfg.lm.epsilons:
        def bpb(arm):
            return {s: r["test_bpb"] for s, r in val.get((eps, arm), {}).items()}

        def acc(arm):
            return {s: PERCENT * r["test_common_accuracy"] for s, r in val.get((eps, arm), {}).items()}

        ratio = (f"{params['lora_upload']:,} vs {params['small_lm']:,} parameters up per round"
                 if params.get("lora_upload") and params.get("small_lm") else "upload matched to (a)'s parameters")
        claims = (
            ("lora", "small_lm", bpb, False, uni, "LoRA of the public LLM beats the small LM at equal epsilon "
             "(test bits per byte)"),
            ("lora_upload", "small_lm", bpb, False, uni, f"LoRA of the public LLM beats the small LM at equal "
             f"epsilon and equal upload ({ratio}; test bits per byte)"),
            ("lora", "small_lm", acc, True, mf, "LoRA of the public LLM beats the small LM at equal epsilon "
             "(test next-token accuracy % on the common targets: tokens in the small LM's vocabulary)"),
            ("lora", "zero_shot", bpb, False, uni, "DP-FTRL LoRA improves on the public LLM zero-shot (the "
             "premise: the users' data helps; test bits per byte)"),
            ("small_lm", "zero_shot", bpb, False, uni, "the small LM trained with the LLM's help beats the LLM "
             "zero-shot (test bits per byte)"))
        for a, b, metric, higher, trivial, claim in claims:
            text = f"[eps {eps:g}] {claim}"
            A, B = metric(a), metric(b)
            if not A or not B:
                missing = ", ".join(x for x, m in ((a, A), (b, B)) if not m)
                res.append(V.not_run(text, f"arm(s) not in this run: {missing}"))
                continue
            res.append(V.compare(text, A, B, higher_is_better=higher, trivial=(trivial, trivial),
                                 names=(L[a], L[b]), digits=4))
        if "lora_all_layers" in cfg.arms:
            text = (f"[eps {eps:g}] adapters on the top {cfg.top_layers} blocks are as good as on every block "
                    "(equivalence within 0.02 bits per byte; test)")
            A, B = bpb("lora"), bpb("lora_all_layers")
            res.append(V.equivalence(text, A, B, margin=0.02, higher_is_better=False, trivial=(uni, uni),
                                     names=(L["lora"], L["lora_all_layers"]))
                       if A and B else V.not_run(text, "arm(s) not in this run"))
    return res


def curves_figure(cfg, out: dict, path: str) -> str | None:
    curves = {}
    for eps in cfg.lm.epsilons:
        for arm in cfg.arms:
            rs = [r for r in out["runs"] if r["arm"] == arm and r.get("target_epsilon") == eps and r.get("val_curve")]
            if not rs:
                continue
            pts = {}
            for r in rs:
                for rnd, v in [(0, r["val_round0"]["bits_per_byte"])] + [tuple(p) for p in r["val_curve"]]:
                    pts.setdefault(int(rnd), []).append(v)
            xs = sorted(pts)
            curves[f"{arm} eps {eps:g}"] = (xs, [float(np.mean(pts[x])) for x in xs])
    zero = next((r for r in out["runs"] if r["arm"] == "zero_shot"), None)
    if zero is not None and curves:
        curves["zero-shot LLM"] = ([0, cfg.lm.rounds], [zero["val"]["bits_per_byte"]] * 2)
    if not curves:
        return None
    return plot_curves(curves, path, "DP-FTRL round", "validation bits per byte (lower is better)",
                       title="validation bits per byte per round (mean over seeds)")


def notes(cfg, out: dict, spec: str, workdir: str) -> list[str]:
    c = cfg.lm
    d = out["data"]
    lora_rows = {r["arm"]: r for r in out["runs"] if r["arm"] in R.LORA_ARMS}
    lora_desc = "; ".join(f"{a}: rank {r['lora']['rank']} on {'/'.join(r['lora']['targets'])} of the "
                          + ("top " + str(r['lora']['top_layers']) if r['lora']['top_layers'] else "every")
                          + " block(s), alpha/r = " + f"{r['lora']['alpha'] / r['lora']['rank']:g}"
                          for a, r in lora_rows.items())
    return [
        f"{c.corpus}: {d.get('train_clients')} training users (the same for every private arm), DP-FTRL {c.rounds} "
        f"rounds, cohort {c.cohort_size}" + (f" with the noise of {c.noise_cohort_size}" if c.noise_cohort_size else "")
        + f", delta {c.delta:g}, unit: user; one ledger per (seed, epsilon, private arm)",
        *R.epsilon_note(out["runs"]),
        f"(a) {c.arch} (embed {c.embed_dim}, hidden {c.hidden_dim}, {out['small_params']:,} params) on the teacher's "
        f"BPE restricted to {d.get('vocab_kept')} ids + UNK; public pre-training by distillation "
        f"({c.long_distill_steps} steps on {c.long_q:g} of a {c.pool_size or 'whole'}-sentence public pool); "
        f"DP-FTRL server lr " + ", ".join(f"{R.public.at_epsilon(c, e).server_lr:g} at eps {e:g}" for e in c.epsilons)
        + f", client lr {c.client_lr:g}, clip {c.clip_norm:g}, {c.max_local_steps} local steps of {c.batch_size}, "
        f"<= {c.max_examples_per_client} examples per user; UNK targets trained (train_on_unk={c.train_on_unk})",
        f"(b) SmolLM2-135M-Instruct over its full BPE ({d.get('llm_vocab_size'):,} ids), frozen weights "
        f"{cfg.frozen_dtype}, lower-block cache {cfg.cache_dtype}; {lora_desc}; server lr "
        + ", ".join(f"{cfg.lora_server_lr(e):g} (clip {cfg.lora_clip(e):g}) at eps {e:g}" for e in c.epsilons)
        + f", client lr {cfg.lora_client_lr:g}, {cfg.lora_local_steps} local step(s) "
        f"of {cfg.lora_batch_size}, <= {cfg.lora_examples_per_client} examples per user",
        f"test set (every arm): {d.get('test_examples')} examples of the test users (<= {cfg.lora_examples_per_client} "
        f"per user), {d.get('test_targets'):,} targets, {d.get('test_bytes'):,.0f} bytes; (a)'s UNK share of "
        f"its test text targets {PERCENT * out['unk_rate_small']:.1f} %",
        "bits per byte: sum over test targets of -log2 p(target) (+ -log2 q(token | UNK) for (a)'s UNK targets, q "
        "the public pool's add-1/2 unigram over the folded tokens) / UTF-8 bytes the targets cover; EOS counts one "
        "byte, BOS is never a target; truncated messages cover their kept tokens' bytes only",
        "accuracy: each model's own in-vocabulary next-token accuracy (argmax over text tokens only); 'common "
        "targets': the positions whose target is in (a)'s vocabulary, the same for every arm",
        "client cost: closed-form FLOPs of the local steps per participating client and round (matmuls; "
        "fedpriv.recipes.llm_lora.*_step_flops, checked against XLA's count), XLA's peak bytes of one compiled "
        "client step, float32 bytes down/up; the LLM arms also hold the frozen model (a one-time download) and "
        "run the cache pass once per example",
        "rounds to target: the first evaluated round whose validation bits per byte reaches "
        + (f"{cfg.target_bpb:g}" if cfg.target_bpb else "(a)'s final validation bits per byte (same seed and "
           "epsilon)") + f", evaluated every {c.eval_every} rounds ('-': not within the run)",
        "not covered by the ledger: every evaluation and baseline (exact statistics of held-out / training users)",
        f"Regenerate: .venv/bin/python -m experiments.llm_lora --config {spec} --workdir {workdir}"]


def main(argv=None):
    cfg, workdir, spec = common.config_and_workdir(argv, __doc__, "llm_lora")
    out = R.run_arms(cfg, workdir)
    rows = per_run_rows(cfg, out["runs"])
    common.write_table(rows, workdir, "llm_lora_runs")
    common.write_table(cost_table(cfg, out, rows), workdir, "costs", title="Client cost per round, per arm")
    phases = {f"invocation: {k}": [v] for k, v in out.get("phase_seconds", {}).items()}
    for r in out["runs"]:
        for k, v in (r.get("phase_seconds") or {}).items():
            phases.setdefault(f"{r['arm']}: {k}", []).append(v)
    common.write_table([{"phase": k, "CPU s (mean over runs)": round(float(np.mean([x["cpu"] for x in v])), 1),
                         "wall s (mean over runs)": round(float(np.mean([x["wall"] for x in v])), 1),
                         "runs": len(v)} for k, v in phases.items()], workdir, "phases",
                       title="CPU and wall seconds per phase (wall: a shared machine)")
    common.write_verdicts(verdicts(cfg, out, rows), workdir)
    curves_figure(cfg, out, os.path.join(workdir, "llm_lora.png"))
    _, md = common.write_table(aggregate(cfg, out, rows), workdir, "llm_lora", notes=notes(cfg, out, spec, workdir),
                               title="The public LLM as the on-device model: DP-FTRL LoRA vs the small LM vs zero-shot")
    common.save_json({"rows": rows, "baselines": out["baselines"], "data": out["data"],
                      **common.run_record(cfg, list(cfg.lm.seeds))}, os.path.join(workdir, "summary.json"))
    print(open(md).read())


if __name__ == "__main__":
    common.cli(main)
