"""Command line: ``python -m fedpriv privacy ...`` answers "what epsilon did I get?".

    python -m fedpriv privacy dp-ftrl --noise-multiplier 8.83 --rounds 1600 --delta 1e-6 [--rounds-per-epoch R]
    python -m fedpriv privacy dp-fedavg --noise-multiplier Z --sampling-rate Q --rounds T --delta D
    python -m fedpriv privacy calibrate dp-ftrl --epsilon E --rounds T --delta D [--rounds-per-epoch R]
    python -m fedpriv privacy calibrate dp-fedavg --epsilon E --sampling-rate Q --rounds T --delta D

DP-FTRL's event is built by ``fedpriv.dp.accounting.dp_ftrl_event(z, T, R)``, the function the
engine uses (``ShuffledPassSampler``): ``T // R`` full trees of ``R`` rounds (one per epoch,
each user at most once per epoch) plus a remainder tree of ``T % R``; without
``--rounds-per-epoch`` one pass, one tree. (There is no ``--epochs``: K equal trees are not what
the engine runs unless K divides T, and then it is ``--rounds-per-epoch T/K``.)

``--json`` prints one strict JSON object (mechanism, epsilon, delta, noise_multiplier,
accountant, ...): an infinite epsilon (e.g. noise multiplier 0) is the string ``"inf"``, a NaN
is ``null`` — never the bare ``Infinity``/``NaN`` that strict parsers reject.
Bad arguments (an option given twice included: two conflicting settings, never the last one
silently), and questions the accountants cannot answer (an epsilon too large to calibrate, PLD at
a tiny noise multiplier, more than ``accounting.MAX_ROUNDS`` rounds, a noise multiplier above
``accounting.MAX_NOISE_MULTIPLIER``, ``--accountant pld`` where RDP's epsilon exceeds
``accounting.MAX_PLD_EPSILON``), print a one-line ``error: ...`` and exit with status 2. With
the default ``--accountant best`` such a run reports RDP's bound (the JSON's ``accountant``
says which), in bounded time. Unit of privacy: the user.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

import dp_accounting as dpa

from fedpriv.argparsing import Parser, one_line
from fedpriv.dp import accounting


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
        p.add_argument("--rounds-per-epoch", type=int, default=None,
                       help="R: rounds per epoch; the tree restarts every epoch (default: one "
                            "pass, one tree)")
    p.add_argument("--accountant", choices=["best", "rdp", "pld"], default="best")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m fedpriv", description="fedpriv command line")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    # dispatched by main() before parsing (its own parser: fedpriv.audit.cli); listed for --help
    sub.add_parser("audit", help="empirical privacy audit of the FL engine with canary clients "
                                 "(python -m fedpriv audit --help)", add_help=False)
    priv = sub.add_parser("privacy", help="privacy accounting")
    psub = priv.add_subparsers(dest="what", required=True, parser_class=Parser)
    _common(psub.add_parser("dp-ftrl", help="epsilon of DP-FTRL (tree aggregation)"), False, False)
    _common(psub.add_parser("dp-fedavg", help="epsilon of DP-FedAvg (Poisson sampling)"), False, True)
    cal = psub.add_parser("calibrate", help="noise multiplier for a target epsilon")
    csub = cal.add_subparsers(dest="mechanism", required=True, parser_class=Parser)
    _common(csub.add_parser("dp-ftrl"), True, False)
    _common(csub.add_parser("dp-fedavg"), True, True)
    return ap


_NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d)")


def _join_negative_values(argv):
    """``--delta -1e-6`` -> ``--delta=-1e-6``: argparse takes ``-1e-6`` for an option (its
    negative-number test misses exponents) and says "expected one argument"; joined, the value
    reaches the validators, which name the problem."""
    out = []
    for tok in argv:
        if (out and _NEGATIVE_NUMBER.match(tok) and out[-1].startswith("--")
                and "=" not in out[-1]):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def _event_fn(mech: str, args):
    if mech == "dp-ftrl":
        return lambda z: accounting.dp_ftrl_event(z, args.rounds, args.rounds_per_epoch)
    return lambda z: accounting.dp_fedavg_poisson_event(z, args.sampling_rate, args.rounds)


def run(argv=None) -> tuple[dict, bool]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(_join_negative_values(argv))
    calibrate = args.what == "calibrate"
    mech = args.mechanism if calibrate else args.what
    accounting.check_rounds(args.rounds)
    accounting.check_delta(args.delta)
    if mech == "dp-fedavg":
        accounting.check_sampling_rate(args.sampling_rate)
    else:
        accounting.epoch_lengths(args.rounds, args.rounds_per_epoch)  # validates R
    make = _event_fn(mech, args)
    if calibrate:
        accounting.check_epsilon(args.epsilon)
        z = accounting.calibrate_noise_multiplier(make, args.epsilon, args.delta,
                                                  accountant=args.accountant)
    else:
        z = accounting.check_noise_multiplier(args.noise_multiplier)
    try:
        eps, acc = accounting.compute_epsilon(make(z), args.delta, accountant=args.accountant)
    except dpa.UnsupportedEventError as err:
        hint = " (PLD needs noise multiplier >= 0.3: use --accountant rdp or best)" \
            if args.accountant == "pld" else ""
        raise ValueError(f"the {args.accountant} accountant cannot account for {mech} at noise "
                         f"multiplier {z:g}{hint}") from err
    out = {"mechanism": mech, "epsilon": eps, "delta": args.delta, "noise_multiplier": z,
           "accountant": acc, "rounds": args.rounds, "unit": "user", "neighboring": "add_remove"}
    if mech == "dp-ftrl":
        out["rounds_per_epoch"] = args.rounds_per_epoch
        out["trees"] = accounting.epoch_lengths(args.rounds, args.rounds_per_epoch)
    else:
        out["sampling_rate"] = args.sampling_rate
    if calibrate:
        out["target_epsilon"] = args.epsilon
    return out, args.json


def strict_json(value):
    """``value`` with non-finite floats made strict-JSON safe: +-inf -> "inf"/"-inf", NaN -> None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def main(argv=None) -> int:
    """``fedpriv privacy ...`` (accounting) and ``fedpriv audit ...`` (the privacy audit);
    the ``fedpriv`` console script and ``python -m fedpriv``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["audit"]:
        from fedpriv.audit import main as audit_main
        return audit_main(argv[1:])
    try:
        out, as_json = run(argv)
    except (ValueError, dpa.UnsupportedEventError) as err:
        msg = one_line(err) or type(err).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(strict_json(out), allow_nan=False))
    elif "target_epsilon" in out:
        print(f"{out['mechanism']}: noise multiplier z = {out['noise_multiplier']:.4f} gives "
              f"epsilon = {out['epsilon']:.4f} (target {out['target_epsilon']}) at delta = "
              f"{out['delta']:g} [{out['accountant']}, user-level]")
    else:
        print(f"{out['mechanism']}: epsilon = {out['epsilon']:.4f} at delta = {out['delta']:g} "
              f"(z = {out['noise_multiplier']}, {out['rounds']} rounds) [{out['accountant']}, user-level]")
    return 0
