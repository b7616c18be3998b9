"""Private FL of an on-device LM on a real user-keyed corpus (Wang et al. 2023 §2, §3, App. C).

    python -m experiments.lm_fl --config configs/lm_fl.py:small --workdir runs/lm_fl

The recipe is ``fedpriv.recipes.lm.run_lm_fl``; this module is its command line.
"""
from __future__ import annotations

from experiments import common
from fedpriv.recipes.lm import run_lm_fl


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "lm_fl")
    s = run_lm_fl(cfg, workdir)
    print(f"final: val accuracy {s['val_accuracy']:.4f}, test accuracy {s['test_accuracy']:.4f} "
          f"(most-frequent-token baseline {s['most_frequent_token_val_accuracy']:.4f}); "
          f"wrote {workdir}/summary.md")


if __name__ == "__main__":
    common.cli(main)
