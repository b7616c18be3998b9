"""docs/fidelity.md from the configs: per artefact, the paper's setting beside our ``paper``
scale (data, population, model, rounds, cohort, noise, epsilon simulated / spent, GPU time).

    python -m experiments.fidelity [--out docs/fidelity.md] [--no-accounting]

The logic is ``fedpriv.recipes.fidelity``; this module is its command line.
"""
from __future__ import annotations

from experiments import common, power
from fedpriv.recipes import fidelity


def main(argv=None):
    ap = common.ArgumentParser(prog="python -m experiments.fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/fidelity.md")
    ap.add_argument("--no-accounting", action="store_true",
                    help="skip the privacy plans' epsilons (fast; the epsilon column says so)")
    args = ap.parse_args(argv)
    print(f"wrote {fidelity.write(args.out, account_plans=not args.no_accounting, power_block=power.block())}")


if __name__ == "__main__":
    common.cli(main)
