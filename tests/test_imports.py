"""The ``fedpriv`` package has no import circle.

The module-level import graph is built from the AST of every ``fedpriv/**/*.py``: an edge
``a -> b`` for each ``import``/``from ... import`` that runs when ``a`` is imported (module body,
class bodies, module-level ``if``/``try``/``with`` blocks; not function bodies, which run later,
and not ``if TYPE_CHECKING:`` blocks, which never run). Importing ``fedpriv.x.y`` also runs the
``__init__`` of ``fedpriv.x``, so the edge goes to that package too, unless it is a package that
contains ``a`` (it is being imported already). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``.

Run as a script (``python -m tests.test_imports [subpackage]``) to print the graph.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "fedpriv"


def module_files(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt]):
    """Import statements executed at import time (recursing into blocks, not functions)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                sub = getattr(node, field, None)
                if isinstance(sub, list):
                    yield from _import_nodes([s for s in sub if isinstance(s, ast.AST)])


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the ``package`` modules it imports at module level (see the module doc)."""
    files = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
                continue
            if node.level:  # relative: resolve against the importing module's package
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                targets.add(sub if sub in files else src)
        edges: set[str] = set()
        own = set(_ancestors(mod))
        for t in targets:
            if t not in files:
                continue
            edges.update(p for p in [*_ancestors(t), t] if p in files and p not in own)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph``, or ``None``."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_detects_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_module_level_imports_only(tmp_path):
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pk.a import f\n")
    (pkg / "a.py").write_text("from pk import b\n\ndef f():\n    from pk import c\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pk import a\ntry:\n    from . import c\nexcept ImportError:"
                              "\n    pass\n")
    (pkg / "c.py").write_text("import pk.a\n")
    g = import_graph(tmp_path, "pk")
    assert g == {"pk": {"pk.a"}, "pk.a": {"pk.b"}, "pk.b": {"pk.c"}, "pk.c": {"pk.a"}}
    assert find_cycle(g) == ["pk.a", "pk.b", "pk.c", "pk.a"]


@pytest.mark.parametrize("package", [PACKAGE])
def test_no_import_cycle(package):
    graph = import_graph(ROOT, package)
    assert len(graph) > 10
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


if __name__ == "__main__":  # print the graph of fedpriv or of one subpackage
    prefix = sys.argv[1] if len(sys.argv) > 1 else PACKAGE
    g = import_graph()
    for mod in sorted(g):
        if mod == prefix or mod.startswith(prefix + "."):
            print(f"{mod} -> {', '.join(sorted(g[mod])) or '-'}")
    print("cycle:", find_cycle(g))
