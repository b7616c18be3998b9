"""Benchmarks: figures, not tests (see BUILD.md)."""
import json
import os


def write_results(out: dict, md: str, prefix: str) -> None:
    """``out`` as ``<prefix>.json`` and ``md`` as ``<prefix>.md`` (the folder made if needed)."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(prefix + ".md", "w") as f:
        f.write(md)
