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


# functions of fedpriv/ over MAX_FUNCTION_LINES lines (issue 52: one job per function): none
# (the last three, recipes/public.py's run_rows and _arch_verdicts and tokenizer_study.verdicts,
# were cut in issue 52). An entry here is a known exception to remove once its function is cut.
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS: set = set()


def long_functions(root: str = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"path:function": lines}`` of the functions of ``fedpriv/`` longer than ``limit`` lines
    (def to last line, docstring included; nested functions counted on their own too)."""
    import ast
    import pathlib
    out = {}
    for path in sorted(pathlib.Path(root, "fedpriv").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = n
    return out


def test_no_function_in_fedpriv_is_over_80_lines(tmp_path):
    found = long_functions()
    assert set(found) <= LONG_FUNCTIONS, {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert set(found) == LONG_FUNCTIONS, f"cut since: remove {LONG_FUNCTIONS - set(found)} from LONG_FUNCTIONS"
    (tmp_path / "fedpriv").mkdir()  # the measure itself: a 81-line function is found, 80 is not
    (tmp_path / "fedpriv" / "m.py").write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n"
                                                + "    x = 1\n" * 79)
    assert long_functions(str(tmp_path)) == {"fedpriv/m.py:f": 81}
