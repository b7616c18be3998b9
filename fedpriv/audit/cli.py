"""``fedpriv audit``: the command line and its Markdown / JSON report (see :mod:`fedpriv.audit`)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from fedpriv.argparsing import Parser, one_line  # one-line errors (status 2), every option at most once
from fedpriv.audit.core import BREAKS, MECHANISMS, PRESETS, AuditSettings, run_audit
from fedpriv.audit.epsilon import AuditError


# ----------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return ">=500" if x >= 500 else f"{x:.2f}"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| mechanism | variant | accountant ε | empirical ε lower bound (estimate) | "
             "90% bootstrap | null ε | final / iterates / known | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        by = r["empirical_by_statistic"]
        parts = " / ".join(_fmt(by[k]) if k in by else "–" for k in ("final", "iterates", "known"))
        lo, hi = r["empirical_interval_90"]
        lines.append(f"| {r['mechanism']} | {r['label']} | {r['accountant_epsilon']:.2f} "
                     f"({r['accountant']}) | {_fmt(r['empirical_epsilon'])} | {_fmt(lo)}–{_fmt(hi)} "
                     f"| {_fmt(r['null_epsilon'])} | {parts} | {r['verdict']} |")
    return "\n".join(lines)


def report_markdown(rows: list[dict], command: str) -> str:
    s0 = rows[0]
    head = [
        "# Empirical privacy audit (one-shot estimation, Andrew et al., ICLR 2024)",
        "",
        f"Command: `{command}`",
        "",
        f"Unit of privacy: the user (client). delta = {s0['delta']:g}. The empirical epsilon is an "
        "*estimate* of a lower bound under the one-shot method's assumptions (Gaussian fits to the "
        "canary statistics), not a proof; the accountant's epsilon is the upper bound claimed for "
        "the run (its event is derived from the *claimed* configuration, also for the broken "
        "variants). Rows marked BROKEN are deliberately broken mechanisms built by the audit.",
        "",
        markdown_table(rows),
        "",
        "Statistics: final = cosine of the final model delta with the canary (the paper's final-model "
        "estimate); iterates = (d·||projection of the canary on the span of the per-round updates||² / T)^(1/3) "
        "(all iterates, participation unknown); known = GLS score with the canary's participation "
        "known (all iterates; shuffled-pass samplers only). The interval resamples canaries and "
        "held-out directions (finite-sample error only); a break counts as DETECTED when even its "
        "lower end exceeds the accountant's epsilon. null ε = the same estimate between two sets of "
        "held-out directions (the audit's resolution; nothing below it can be told apart from "
        "finite-sample error).",
        "",
        "Settings:",
        "",
    ]
    seen = set()
    for r in rows:
        st = r["settings"]
        key = json.dumps(st, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        head.append(f"- {r['mechanism']}: " + ", ".join(f"{k}={v}" for k, v in st.items() if v is not None))
    return "\n".join(head) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m fedpriv audit",
                 description="Empirical privacy audit of the FL engine with canary clients "
                             "(one-shot estimation, Andrew et al. ICLR 2024).")
    ap.add_argument("--mechanism", default="all", help="dp-fedavg, dp-ftrl or all (default)")
    ap.add_argument("--variants", default="all",
                    help=f"comma list of {', '.join(BREAKS)}, or all (default; twice-per-epoch "
                         "only for dp-ftrl)")
    for flag, typ, what in (("--noise-multiplier", float, "z"), ("--rounds", int, "rounds T"),
                            ("--dim", int, "model dimension d"),
                            ("--clients", int, "real (non-canary) clients"),
                            ("--canaries", int, "inserted canary clients k"),
                            ("--heldout", int, "held-out canary directions k'"),
                            ("--sampling-rate", float, "Poisson q (dp-fedavg)"),
                            ("--cohort-size", int, "clients per round (dp-ftrl)"),
                            ("--clip-norm", float, "clip norm C"),
                            ("--canary-norm", float, "canary raw norm / C (> 1)"),
                            ("--delta", float, "delta"), ("--seed", int, "seed")):
        ap.add_argument(flag, type=typ, default=None, help=f"{what} (default: the preset)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--workdir", default=None, help="write audit.md and audit.json here")
    return ap


_FIELDS = {"noise_multiplier": "noise_multiplier", "rounds": "rounds", "dim": "dim",
           "clients": "num_real", "canaries": "num_canaries", "heldout": "num_heldout",
           "clip_norm": "clip_norm", "canary_norm": "canary_norm", "delta": "delta", "seed": "seed"}


def plan(argv=None) -> tuple[list[tuple[AuditSettings, str]], argparse.Namespace]:
    """Parse ``argv`` into the list of (settings, variant) to run; raises AuditError."""
    args = build_parser().parse_args(argv)
    mechs = list(MECHANISMS) if args.mechanism == "all" else [args.mechanism]
    if any(m not in MECHANISMS for m in mechs):
        raise AuditError(f"--mechanism must be dp-fedavg, dp-ftrl or all, got {args.mechanism!r}")
    if args.sampling_rate is not None and "dp-fedavg" not in mechs:
        raise AuditError("--sampling-rate applies to dp-fedavg (Poisson sampling) only")
    if args.cohort_size is not None and "dp-ftrl" not in mechs:
        raise AuditError("--cohort-size applies to dp-ftrl (shuffled passes) only")
    if args.variants == "all":
        wanted = list(BREAKS)
    else:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in wanted if v not in BREAKS]
        if bad or not wanted:
            raise AuditError(f"unknown variant {bad[0] if bad else args.variants!r}; "
                             f"choose from {', '.join(BREAKS)} or all")
        if "twice-per-epoch" in wanted and mechs == ["dp-fedavg"]:
            raise AuditError("twice-per-epoch breaks DP-FTRL's one participation per epoch; "
                             "use it with --mechanism dp-ftrl")
    runs = []
    for m in mechs:
        kw = dict(PRESETS[m])
        for arg, field in _FIELDS.items():
            v = getattr(args, arg)
            if v is not None:
                kw[field] = v
        if m == "dp-fedavg" and args.sampling_rate is not None:
            kw["sampling_rate"] = args.sampling_rate
        if m == "dp-ftrl" and args.cohort_size is not None:
            kw["cohort_size"] = args.cohort_size
        s = AuditSettings(**kw)
        for v in wanted:
            if v == "twice-per-epoch" and m != "dp-ftrl":
                continue
            runs.append((s, v))
    return runs, args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        runs, args = plan(argv)
        if args.workdir:
            os.makedirs(args.workdir, exist_ok=True)
        rows = [run_audit(s, v) for s, v in runs]
    except (AuditError, ValueError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot use --workdir {args.workdir!r}: {err.strerror}", file=sys.stderr)
        return 2
    command = " ".join(["python -m fedpriv audit", *argv])
    report = {"method": "one-shot empirical privacy estimation (Andrew et al., ICLR 2024)",
              "estimate": "lower-bound estimate under the method's assumptions, not a proof",
              "unit": "user", "command": command, "rows": rows}
    text_json = json.dumps(report, indent=1, allow_nan=False)
    md = report_markdown(rows, command)
    if args.workdir:
        try:
            os.makedirs(args.workdir, exist_ok=True)
            with open(os.path.join(args.workdir, "audit.json"), "w") as f:
                f.write(text_json + "\n")
            with open(os.path.join(args.workdir, "audit.md"), "w") as f:
                f.write(md)
        except OSError as err:
            print(f"error: cannot write to --workdir {args.workdir!r}: {err.strerror}", file=sys.stderr)
            return 2
    print(text_json if args.json else md, end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

