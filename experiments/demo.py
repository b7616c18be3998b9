"""The main job (``make demo``): DP-FTRL training of an on-device LSTM on chitchat.

    python -m experiments.demo --config configs/demo.py:small --workdir runs/demo

Prints each evaluation's accuracy and the epsilon spent; writes ``metrics.jsonl``,
``summary.md``/``summary.json`` and ``learning_curve.png`` to the work directory. Re-running
with the same work directory resumes from the last checkpoint.
"""
from __future__ import annotations

from experiments import common
from fedpriv.recipes import lm


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, "fedpriv demo: DP-FTRL LSTM on chitchat", "demo")
    print(f"fedpriv demo: {cfg.algorithm} on {cfg.corpus} ({cfg.arch}, vocab {cfg.vocab_size}, "
          f"{cfg.rounds} rounds x {cfg.cohort_size} clients), work directory {workdir}")
    s = lm.run_lm_fl(cfg, workdir)
    d = s["data"]
    print(f"data: {d['train_clients']} training users ({d['train_examples']} messages, "
          f"{d['train_tokens']} tokens); {d['val_clients']} validation users")
    print(f"final validation accuracy {s['val_accuracy']:.4f}, test accuracy {s['test_accuracy']:.4f} "
          f"(predicting the most frequent token: {s['most_frequent_token_val_accuracy']:.4f})")
    if s["epsilon"] is not None:
        print(f"privacy: epsilon = {s['epsilon']:.3f} at delta = {s['delta']:g}, user-level "
              f"[{s['noise_note']}]")
    print(f"wall clock {s['wall_clock_s']:.0f} s; results in {workdir}/summary.md, "
          f"metrics.jsonl, learning_curve.png")


if __name__ == "__main__":
    common.cli(main)
