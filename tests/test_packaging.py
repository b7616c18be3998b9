"""The package installs: a wheel built from pyproject.toml holds every module of fedpriv, the
``fedpriv`` console script, the license, and imports from outside the repository. The lock
(requirements.lock, what `make setup` installs with --no-deps) pins every transitive package."""
import os
import pathlib
import platform
import re
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


# --- the lock: requirements.lock is what `make setup` installs (with --no-deps) ---------------------

LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9.!+_-]+)")


def _norm(name):
    """PEP 503 normalised project name (``array_record`` and ``Array-Record`` are one project)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(text, what):
    """``{normalised name: version}`` of a requirements file whose every entry is ``name==version``.

    Comments, blank lines and ``--hash=`` continuations are allowed; anything else (a range, no
    version, an extra, a marker, a URL, an option such as ``-r``/``-e``) is refused, as is a
    project pinned twice."""
    text = re.sub(r"\\\n", " ", text)                  # join backslash continuations (hashes)
    pins = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *hashes = line.split()
        m = PIN.fullmatch(spec)
        if m is None or any(not h.startswith("--hash=") for h in hashes):
            raise AssertionError(f"{what} line {n}: {line!r} is not name==version")
        name = _norm(m.group(1))
        if name in pins:
            raise AssertionError(f"{what} line {n}: {m.group(1)} is pinned twice")
        pins[name] = m.group(2)
    return pins


def _check_lock(requirements, lock):
    """Every top-level pin is in the lock at the same version; returns the lock's pins."""
    top, locked = _pins(requirements, "requirements.txt"), _pins(lock, "requirements.lock")
    missing = sorted(n for n in top if n not in locked)
    assert not missing, f"pinned in requirements.txt but not in requirements.lock: {missing}"
    differ = {n: (v, locked[n]) for n, v in top.items() if locked[n] != v}
    assert not differ, f"requirements.txt vs requirements.lock versions differ: {differ}"
    return locked


def test_lock_pins_every_requirement_exactly():
    locked = _check_lock((ROOT / "requirements.txt").read_text(), LOCK.read_text())
    assert len(locked) > len(_pins((ROOT / "requirements.txt").read_text(), "requirements.txt"))
    # what make setup installs: the lock with --no-deps, never requirements.txt with deps
    make = (ROOT / "Makefile").read_text()
    assert "--no-deps -r requirements.lock" in make, "make setup does not install the lock --no-deps"
    assert "-r requirements.txt" not in make, "make setup installs requirements.txt (unlocked deps)"
    assert re.search(r"^\$\(STAMP\):.*\brequirements\.lock\b", make, re.M), \
        "the setup stamp does not depend on requirements.lock (a changed lock would not reinstall)"


def test_lock_checks_refuse_unpinned_ranges_and_drift():
    """The checks above fail on what they guard against (so a weakened parser shows up here)."""
    req, lock = "jax==0.10.2  # comment\n", "# header\njax==0.10.2\n    # via -r requirements.txt\n"
    assert _check_lock(req, lock) == {"jax": "0.10.2"}
    assert _pins("a-b==1 \\\n    --hash=sha256:00\n", "x") == {"a-b": "1"}
    for bad_lock in (lock + "foo\n", lock + "foo>=1\n", lock + "foo==1 ; python_version<'4'\n",
                     lock + "foo[x]==1\n", lock + "-r other.txt\n", lock + "foo @ file:///x\n",
                     lock + "Jax==0.10.2\n"):
        with pytest.raises(AssertionError, match="requirements.lock line"):
            _check_lock(req, bad_lock)
    for bad_req in (req + "orbax-checkpoint\n", req + "optax>=0.2\n"):
        with pytest.raises(AssertionError, match="requirements.txt line"):
            _check_lock(bad_req, lock)
    with pytest.raises(AssertionError, match="not in requirements.lock"):
        _check_lock(req + "optax==0.2.8\n", lock)
    with pytest.raises(AssertionError, match="versions differ"):
        _check_lock("jax==0.10.3\n", lock)


def test_every_declared_dependency_is_pinned_within_its_range():
    """Each dependency of pyproject.toml (and of its extras) has a top-level pin in
    requirements.txt that its range admits: no direct dependency is left to the resolver."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += [r for r in extra if _norm(Requirement(r).name) != "fedpriv"]
    top = _pins((ROOT / "requirements.txt").read_text(), "requirements.txt")
    bad = [r for r in declared if _norm(Requirement(r).name) not in top
           or not Requirement(r).specifier.contains(top[_norm(Requirement(r).name)], prereleases=True)]
    assert not bad, f"declared in pyproject.toml but not pinned (within range) in requirements.txt: {bad}"


def _installed_lock():
    """The lock's pins, or skip unless this interpreter has exactly those versions installed."""
    from importlib import metadata

    from packaging.version import Version
    locked = _pins(LOCK.read_text(), "requirements.lock")
    wrong = {}
    for name, version in locked.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or Version(have) != Version(version):
            wrong[name] = (version, have)
    return locked, wrong


def test_installed_distributions_match_the_lock():
    """In the project's .venv (what `make setup` built), every locked project is installed at
    its locked version: the environment the suite runs in is the one the lock describes."""
    if pathlib.Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not running from the project's .venv ({sys.prefix})")
    _, wrong = _installed_lock()
    assert not wrong, f"installed vs locked (locked, installed): {wrong}"


def test_lock_is_the_closure_of_requirements():
    """The lock holds every project that the top-level pins need, transitively (each requirement
    of each locked project, extras and markers evaluated for this interpreter, is locked at a
    version its specifier admits: what ``pip check`` checks after ``pip install --no-deps``),
    and nothing else. Read offline from the installed distributions' metadata."""
    if (sys.version_info[:2], sys.platform, platform.machine()) != ((3, 11), "linux", "x86_64"):
        pytest.skip("the lock is resolved for Python 3.11 on Linux x86_64")
    from importlib import metadata

    from packaging.requirements import Requirement
    locked, wrong = _installed_lock()
    if wrong:
        pytest.skip(f"this environment was not installed from the lock: {sorted(wrong)[:5]}")
    roots = _pins((ROOT / "requirements.txt").read_text(), "requirements.txt")
    todo, seen, problems = [(n, "") for n in roots], set(), []
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for text in metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            dep = _norm(req.name)
            if dep not in locked:
                problems.append(f"{name}{f'[{extra}]' if extra else ''} needs {text!r}: not locked")
            elif not req.specifier.contains(locked[dep], prereleases=True):
                problems.append(f"{name} needs {text!r}: locked {locked[dep]}")
            else:
                todo += [(dep, "")] + [(dep, _norm(e)) for e in req.extras]
    assert not problems, problems
    unused = sorted(set(locked) - {n for n, _ in seen})
    assert not unused, f"locked but needed by nothing in requirements.txt: {unused}"
