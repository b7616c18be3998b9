"""The index of the papers' artefacts: ``python -m experiments --list`` names every table and
figure of the three papers, the module and config that regenerate it, and its scales;
``python -m experiments <artefact> [--scale small] [--workdir DIR]`` runs one.

Every module also runs on its own: ``python -m experiments.<module> --config configs/<c>.py:<scale>``.
"""
from __future__ import annotations

import importlib
import os

from experiments import common
from experiments.index import ARTEFACTS, Artefact, available, listing  # noqa: F401 (the index, re-exported)


def main(argv=None):
    ap = common.ArgumentParser(prog="python -m experiments", description=__doc__.splitlines()[0])
    ap.add_argument("artefact", nargs="?", choices=[a.name for a in ARTEFACTS])
    ap.add_argument("--list", action="store_true", help="list every artefact and its command")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--workdir", default=None,
                    help="default runs/<module>, the module's own default (artefacts of one module share it)")
    common.add_executor_arguments(ap)
    args = ap.parse_args(argv)
    if args.list or args.artefact is None:
        rows = listing()
        width = max(len(r["artefact"]) for r in rows)
        for r in rows:
            print(f"{r['artefact']:<{width}}  {r['paper']:<16}  {r['what']}\n{'':<{width}}  "
                  f"{r['command']}" + (f"  [scales: {r['scales']}]" if r["scales"] else ""))
        return
    a = next(a for a in ARTEFACTS if a.name == args.artefact)
    if not available(a):
        raise common.ConfigError(f"{a.name} ({a.paper}: {a.what}) has no experiment module yet")
    if args.scale not in a.scales:
        raise common.ConfigError(f"{a.name} has scales {list(a.scales)}, not {args.scale!r}")
    module = importlib.import_module(f"experiments.{a.module}")
    module.main(["--config", f"configs/{a.config}.py:{args.scale}",
                 "--workdir", args.workdir or os.path.join("runs", a.module), "--workers", str(args.workers),
                 "--cores-per-worker", str(args.cores_per_worker)]
                + (["--cluster", args.cluster] if args.cluster else []))


if __name__ == "__main__":
    common.cli(main)
