"""The committed noise calibrations of the configs (``fedpriv/dp/calibrated.py``).

``fedpriv.dp.accounting.calibrate_noise_multiplier`` searches z by Brent's method, ~25
evaluations of epsilon (RDP, and PLD for "best"); at population_expansion:small's 16 stages that
is ~2 min of CPU before any data is read, in every run and in every test that plans it. The
search's answers for every scale of every config (``configs/*.py``: smoke, small, paper, as
their ``privacy_plan`` calibrates them, which is what their runs calibrate) are committed in
``fedpriv/dp/calibrated.py``; a calibration there is returned after two evaluations that show it
is still the search's answer (``accounting._tabulated``), anything else is searched::

    python -m experiments.calibrations           # rewrite fedpriv/dp/calibrated.py (minutes)
    python -m experiments.calibrations --check   # every entry against its two evaluations

Rerun after changing a config's privacy settings (or the accounting): an entry that no longer
matches a calibration is never used (the digest of its event differs, or a check fails), and
tests/dp/test_calibrated.py fails while a config's plan misses the table.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pathlib
import sys
import textwrap

from experiments import common
from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting, calibrated
from fedpriv.dp.plan import account

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE_PATH = ROOT / "fedpriv" / "dp" / "calibrated.py"
NOT_CONFIGS = ("common", "__init__")
DEFAULT_SCALES = ("smoke", "small", "paper")


def config_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in NOT_CONFIGS)


def scales_of(name: str) -> tuple[str, ...]:
    scales = getattr(importlib.import_module(f"configs.{name}"), "SCALES", None)
    return tuple(scales) if scales else DEFAULT_SCALES


@contextlib.contextmanager
def recording(use_table: bool = False):
    """Every calibration searched inside the block, as ``accounting.CalibrationEntry``s (the
    committed table is not read unless ``use_table``: each calibration is searched afresh)."""
    saved = accounting._RECORDING, accounting._USE_TABLE
    accounting._RECORDING, accounting._USE_TABLE = [], use_table
    try:
        yield accounting._RECORDING
    finally:
        accounting._RECORDING, accounting._USE_TABLE = saved


def plan_calibrations(name: str, scale: str, use_table: bool = False) -> list:
    """The calibrations ``configs/<name>.py:<scale>``'s plan searches (a refused scale: none)."""

    with recording(use_table) as found:
        try:
            cfg = common.load_config(f"configs/{name}.py:{scale}")
            account(importlib.import_module(f"configs.{name}").privacy_plan(cfg))
        except ConfigError:
            pass  # a paper scale refused on the packaged data: it calibrates nothing
    return list(found)


def render(entries: dict) -> str:
    """``fedpriv/dp/calibrated.py``'s text: ``entries`` maps a CalibrationEntry to the
    ``config:scale``s whose plans calibrate it."""
    by_key: dict = {}
    for e, where in entries.items():
        by_key.setdefault(e.key, []).append((e.z, e.digest, sorted(where)))
    lines = ['"""Noise multipliers of the configs\' calibrations, as ``fedpriv.dp.accounting``\'s search',
             "returned them; written by ``python -m experiments.calibrations`` (do not edit by hand).",
             "",
             "``TABLE[(epsilon, delta, neighboring, accountant, tol)]`` = ``((z, digest), ...)``: the",
             "digest is ``accounting.event_digest(make_event(z))``. ``calibrate_noise_multiplier``",
             "returns a z only if its event has that digest and epsilon(z) <= epsilon < epsilon(z - tol).",
             '"""',
             "",
             "TABLE = {"]
    for key in sorted(by_key):
        lines.append(f"    {key!r}: (")
        for z, digest, where in sorted(by_key[key]):
            lines += textwrap.wrap(", ".join(where), 110, initial_indent="        # ",
                                   subsequent_indent="        # ", break_on_hyphens=False)
            lines.append(f"        ({z!r}, {digest!r}),")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="check every committed entry by its two evaluations (writes nothing)")
    args = ap.parse_args(argv)
    if args.check:  # each config's plan with the table: what it still searches is missing or stale
        searched: dict = {}
        for name in config_names():
            for scale in scales_of(name):
                for e in plan_calibrations(name, scale, use_table=True):
                    searched.setdefault(e, set()).add(f"{name}:{scale}")
        for e, where in sorted(searched.items(), key=lambda kv: kv[0].key):
            print(f"searched (not in the table, or stale): epsilon {e.epsilon:g} delta {e.delta:g} "
                  f"{e.accountant}: z = {e.z!r} ({', '.join(sorted(where))})")
        print(f"{sum(len(r) for r in calibrated.TABLE.values())} entries; {len(searched)} calibrations "
              "of the configs searched")
        return 1 if searched else 0
    found: dict = {}
    for name in config_names():
        for scale in scales_of(name):
            print(f"{name}:{scale} ...", file=sys.stderr, flush=True)
            for e in plan_calibrations(name, scale):
                found.setdefault(e, set()).add(f"{name}:{scale}")
    unchecked = {e: w for e, w in found.items() if not e.checked}
    for e, where in unchecked.items():  # epsilon(z - tol) <= epsilon: not the smallest z within tol
        print(f"not tabulated (fails its checks): epsilon {e.epsilon:g} {e.accountant}: z = {e.z!r} "
              f"({', '.join(sorted(where))})")
    table = {e: w for e, w in found.items() if e.checked}
    tmp = TABLE_PATH.with_suffix(".py.tmp")
    tmp.write_text(render(table))
    os.replace(tmp, TABLE_PATH)
    print(f"wrote {TABLE_PATH.relative_to(ROOT)}: {len(table)} calibrations ({len(unchecked)} not tabulated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
