"""Command line: ``python -m fedpriv privacy ...`` answers "what epsilon did I get?".

    python -m fedpriv privacy dp-ftrl --noise-multiplier 8.83 --rounds 1600 --delta 1e-6 [--epochs K]
    python -m fedpriv privacy dp-fedavg --noise-multiplier Z --sampling-rate Q --rounds T --delta D
    python -m fedpriv privacy calibrate dp-ftrl --epsilon E --rounds T --delta D [--epochs K]
    python -m fedpriv privacy calibrate dp-fedavg --epsilon E --sampling-rate Q --rounds T --delta D

``--json`` prints one JSON object (mechanism, epsilon, delta, noise_multiplier, accountant, ...).
Bad arguments print a one-line error and exit with status 2. Unit of privacy: the user.
"""
from __future__ import annotations

import argparse
import json
import sys

from fedpriv.dp import accounting


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        self.exit(2, f"error: {message}\n")


def _common(p, calibrate: bool, fedavg: bool):
    if calibrate:
        p.add_argument("--epsilon", type=float, required=True)
    else:
        p.add_argument("--noise-multiplier", type=float, required=True)
    if fedavg:
        p.add_argument("--sampling-rate", type=float, required=True,
                       help="Poisson sampling probability q of each user per round")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--delta", type=float, required=True)
    if not fedavg:
        p.add_argument("--epochs", type=int, default=1,
                       help="passes over the users; the tree restarts every epoch")
    p.add_argument("--accountant", choices=["best", "rdp", "pld"], default="best")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m fedpriv", description="fedpriv command line")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    priv = sub.add_parser("privacy", help="privacy accounting")
    psub = priv.add_subparsers(dest="what", required=True, parser_class=_Parser)
    _common(psub.add_parser("dp-ftrl", help="epsilon of DP-FTRL (tree aggregation)"), False, False)
    _common(psub.add_parser("dp-fedavg", help="epsilon of DP-FedAvg (Poisson sampling)"), False, True)
    cal = psub.add_parser("calibrate", help="noise multiplier for a target epsilon")
    csub = cal.add_subparsers(dest="mechanism", required=True, parser_class=_Parser)
    _common(csub.add_parser("dp-ftrl"), True, False)
    _common(csub.add_parser("dp-fedavg"), True, True)
    return ap


def _event_fn(mech: str, args):
    if mech == "dp-ftrl":
        steps = accounting.tree_steps_per_epoch(args.rounds, args.epochs)
        return lambda z: accounting.dp_ftrl_event(z, args.rounds, steps_per_tree=steps)
    return lambda z: accounting.dp_fedavg_poisson_event(z, args.sampling_rate, args.rounds)


def run(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    calibrate = args.what == "calibrate"
    mech = args.mechanism if calibrate else args.what
    accounting.check_rounds(args.rounds)
    accounting.check_delta(args.delta)
    if mech == "dp-fedavg":
        accounting.check_sampling_rate(args.sampling_rate)
    make = _event_fn(mech, args)
    if calibrate:
        accounting.check_epsilon(args.epsilon)
        z = accounting.calibrate_noise_multiplier(make, args.epsilon, args.delta,
                                                  accountant=args.accountant)
    else:
        z = accounting.check_noise_multiplier(args.noise_multiplier)
    eps, acc = accounting.compute_epsilon(make(z), args.delta, accountant=args.accountant)
    out = {"mechanism": mech, "epsilon": eps, "delta": args.delta, "noise_multiplier": z,
           "accountant": acc, "rounds": args.rounds, "unit": "user", "neighboring": "add_remove"}
    if mech == "dp-ftrl":
        out["epochs"] = args.epochs
    else:
        out["sampling_rate"] = args.sampling_rate
    if calibrate:
        out["target_epsilon"] = args.epsilon
    return out, args.json


def main(argv=None) -> int:
    try:
        out, as_json = run(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(out))
    elif "target_epsilon" in out:
        print(f"{out['mechanism']}: noise multiplier z = {out['noise_multiplier']:.4f} gives "
              f"epsilon = {out['epsilon']:.4f} (target {out['target_epsilon']}) at delta = "
              f"{out['delta']:g} [{out['accountant']}, user-level]")
    else:
        print(f"{out['mechanism']}: epsilon = {out['epsilon']:.4f} at delta = {out['delta']:g} "
              f"(z = {out['noise_multiplier']}, {out['rounds']} rounds) [{out['accountant']}, user-level]")
    return 0
