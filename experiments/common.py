"""Shared plumbing for experiment modules: config loading, tables, plots, run records."""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time


def load_config(spec: str):
    """``"configs/demo.py:small,rounds=10"`` -> ``get_config("small,rounds=10")`` of that file."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    rel = os.path.relpath(os.path.abspath(path))
    if not rel.startswith("..") and rel.endswith(".py"):  # a module of this repository
        module = importlib.import_module(rel[:-3].replace(os.sep, "."))
    else:
        name = f"_fedpriv_config_{abs(hash(os.path.abspath(path)))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses need their module registered
        module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"{path} has no get_config(arg)")
    return module.get_config(arg)


def run_record(config, seed: int) -> dict:
    """What every result carries: config, seed, versions, git commit, time."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - best effort
        commit = ""
    import jax
    return {"config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "seed": seed, "git_commit": commit, "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_table(rows: list[dict], workdir: str, name: str, columns: list[str] | None = None,
                title: str | None = None, notes: list[str] | None = None) -> tuple[str, str]:
    """Write ``rows`` as ``<name>.csv`` and ``<name>.md`` in ``workdir``; returns the paths."""
    os.makedirs(workdir, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    csv_path = os.path.join(workdir, f"{name}.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    md_path = os.path.join(workdir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return csv_path, md_path


def plot_curves(curves: dict[str, tuple[list, list]], path: str, xlabel: str, ylabel: str, title: str = ""):
    """Line plot of ``{label: (xs, ys)}`` to a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_json(obj, path: str):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)
