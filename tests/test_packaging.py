"""The package installs: a wheel built from pyproject.toml holds every module of fedpriv, the
``fedpriv`` console script, the license, and imports from outside the repository."""
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy of what the sdist holds: an in-tree build/ could carry stale modules
    src = tmp_path_factory.mktemp("src")
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / f, src / f)
    shutil.copytree(ROOT / "fedpriv", src / "fedpriv", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("fedpriv-*.whl")
    return whl


def test_wheel_holds_every_module_the_script_and_the_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "fedpriv").rglob("*.py")}
    assert modules and modules <= names, sorted(modules - names)
    dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    entry = zipfile.ZipFile(wheel).read(f"{dist}/entry_points.txt").decode()
    assert "fedpriv = fedpriv.cli:main" in entry
    assert any(n.endswith("LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(f"{dist}/METADATA").decode()
    assert "Requires-Dist: dp-accounting" in meta and "Provides-Extra: test" in meta


def test_installed_wheel_imports_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = ("import fedpriv, fedpriv.dp, fedpriv.fl, optax, jax; "
            "print(fedpriv.__file__); "
            "tx = fedpriv.dp.tree_privatizer(1.0, jax.random.key(0), 4); "
            "print(isinstance(optax.chain(tx, optax.sgd(0.1)), optax.GradientTransformation))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    file, ok = proc.stdout.split()
    assert file.startswith(str(target)) and ok == "True"  # the installed copy, not the checkout
    cli = subprocess.run([sys.executable, "-m", "fedpriv", "privacy", "dp-ftrl", "--noise-multiplier",
                          "8.83", "--rounds", "1600", "--rounds-per-epoch", "1600", "--delta", "1e-6",
                          "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert '"epsilon": 1.77' in cli.stdout
