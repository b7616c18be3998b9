"""The linter is part of the suite: ``ruff check`` (rules in pyproject.toml ``[tool.ruff]``:
pyflakes, pycodestyle, import order, 120 columns) passes on every Python file of the repository.
ruff is pinned in requirements.lock, so `make test` always has it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_check_passes():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    assert os.path.exists(ruff), f"ruff is not installed next to {sys.executable}: run `make setup`"
    p = subprocess.run([ruff, "check", "--no-cache", "fedpriv", "configs", "experiments", "benchmarks", "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
