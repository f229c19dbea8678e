"""The package's shape: layers import downwards only, and each module keeps its private names.

Two rules, checked from the source (Python's `ast`, so nothing is imported and nothing runs):

    no import cycle inside pipesgd_ref
        counting the imports inside functions too: a lazy import that only exists to break a
        cycle still ties the two modules together for a reader, who must read both at once.
    no `_private` name imported from another module
        a name with a leading underscore is the module's own business; a helper that another
        module needs is public, named and documented where it lives.

And every module imports on its own in a fresh interpreter (`python -c "import M"`), which is
what a user, a tutorial or a spawned worker does first.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipesgd_ref"


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Module name -> source file, for every module of the package (packages by __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(target module, imported name or "", line) for each project import in one module,
    wherever it sits (module level or inside a function). `from pkg import mod` counts as an
    import of pkg.mod; `from mod import name` as one of mod."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..comm import y
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target not in modules:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in modules else
                             (target, alias.name, node.lineno))  # fmt: skip
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: {t for t, _, _ in imports_of(m, p, modules) if t != m} for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def private_imports(modules: dict[str, Path]) -> list[str]:
    bad = []
    for m, p in modules.items():
        for target, name, line in imports_of(m, p, modules):
            if name.startswith("_") and not name.startswith("__") and target != m:
                bad.append(f"{m.replace('.', '/')}.py:{line} imports {name} from {target}")
    return bad


def test_the_checker_sees_modules_and_their_imports():
    modules = module_files()
    assert "pipesgd_ref.commands.train" in modules and "pipesgd_ref.comm.ring" in modules
    graph = import_graph(modules)
    assert "pipesgd_ref.errors" in graph["pipesgd_ref.runtime.launch"]  # a module-level import
    assert any(graph.values()), "no import found at all: the checker is broken"


def test_the_checker_finds_a_cycle_and_a_private_import(tmp_path):
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from demo import a\n    from demo.c import _x\n")
    (pkg / "c.py").write_text("_x = 1\n")
    modules = module_files(pkg)
    assert cycles(import_graph(modules)) == [["demo.a", "demo.b"]]
    assert [s.split(" imports ")[1] for s in private_imports(modules)] == ["_x from demo.c"]


def test_no_import_cycle():
    found = cycles(import_graph(module_files()))
    assert not found, "import cycles inside pipesgd_ref (break each by moving the shared piece "\
        "down a layer):\n" + "\n".join(" <-> ".join(c) for c in found)  # fmt: skip


def test_no_private_name_crosses_modules():
    found = private_imports(module_files())
    assert not found, "private names imported from another module (make them public where "\
        "they live, or move them):\n" + "\n".join(found)  # fmt: skip


@pytest.mark.slow
def test_every_module_imports_alone():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    names = [m for m in module_files() if not m.endswith("__main__")]
    # One fresh interpreter per module, a few at a time: an import that only works after
    # another module was imported first fails here.
    failed = []
    for start in range(0, len(names), 8):
        batch = names[start : start + 8]
        procs = [
            (
                m,
                subprocess.Popen(
                    [sys.executable, "-c", f"import {m}"],
                    env=env,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )  # fmt: skip
            for m in batch
        ]
        for m, proc in procs:
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failed.append(f"{m}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    assert not failed, "modules that do not import alone:\n" + "\n".join(failed)
