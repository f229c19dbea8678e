"""The package's shape read from its source with Python's `ast` (nothing is imported, nothing
runs): its modules and their imports, import cycles, private names imported across modules, and
the figures a reader meets (module and function lengths, the pipe loop, the modules at the
root, method names compared as strings, test modules imported by others). Each finder takes the
root to read, so that tests/test_architecture.py can show it at work on a made-up package, and
returns one line per place found (`file:line ...`). The checks themselves are the tests there.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "pipesgd_ref"

# --- modules and their imports -----------------------------------------------------------------


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
                if sub in modules:
                    found.append((sub, "", node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
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


# --- the figures a reader meets -------------------------------------------------------------------

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
PIPE_LOOP = "methods/pipe.py"
# The lesson core (pipesgd_ref/core): the whole method in one sitting. Its files and every
# module importing it loads (the package's own __init__ included) stay within these.
CORE = "core"
MAX_CORE_LINES = 900
MAX_CORE_FILES = 8
# The product around a loop: reached through the runtime's hooks, never imported by the loop.
NOT_IN_PIPE = ("runtime.checkpoint", "runtime.lifetime", "runtime.faults")
MAX_ROOT_MODULES = 10
METHOD_NAMES = ("sync", "pipe", "ps-sync", "ps-async", "ddp")
MAX_NAME_TESTS = 8


def where(path: Path, root: Path, line: int | None = None) -> str:
    """`pkg/sub/mod.py` or `pkg/sub/mod.py:line`, relative to the folder that holds `root`."""
    name = path.relative_to(root.parent).as_posix()
    return name if line is None else f"{name}:{line}"


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def oversized_modules(root: Path = PACKAGE, limit: int = MAX_MODULE_LINES) -> list[str]:
    """`file: N lines` for each module of more than `limit` lines, longest first."""
    sizes = [(line_count(p), p) for p in sorted(root.rglob("*.py"))]
    return [f"{where(p, root)}: {n} lines" for n, p in sorted(sizes, reverse=True) if n > limit]


def long_functions(root: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name: N lines` for each function (method, nested function) longer than
    `limit` lines, counted from its def line to its last line; longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append((n, f"{where(path, root, node.lineno)} {node.name}: {n} lines"))
    return [text for _, text in sorted(found, key=lambda f: -f[0])]


def loop_problems(
    root: Path = PACKAGE, loop: str = PIPE_LOOP, forbidden: tuple[str, ...] = NOT_IN_PIPE
) -> list[str]:
    """What keeps the loop `loop` (a path under `root`) from reading as the algorithm with
    the product around it reached through hooks: each import of a `forbidden` module."""
    path = root / loop
    if not path.is_file():
        return [f"{where(path, root)}: missing"]
    problems = []
    modules = module_files(root)
    name = next(m for m, p in modules.items() if p == path)
    banned = {f"{root.name}.{m}" for m in forbidden}
    for target, _, line in imports_of(name, path, modules):
        if target in banned:
            problems.append(f"{where(path, root, line)}: imports {target}")
    return problems


def import_closure(start: str, modules: dict[str, Path]) -> set[str]:
    """Every module of `modules` that importing `start` loads: its imports (inside functions
    too), theirs, and the packages above each (Python runs a package's __init__ first)."""
    graph, seen, todo = import_graph(modules), set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo.extend(graph.get(name, ()))
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    return seen


def core_problems(
    root: Path = PACKAGE,
    core: str = CORE,
    max_lines: int = MAX_CORE_LINES,
    max_files: int = MAX_CORE_FILES,
) -> list[str]:
    """What keeps the core from being read in one sitting: a product module in its import
    closure, more than `max_lines` lines or `max_files` files in its files and closure."""
    folder = root / core
    if not folder.is_dir():
        return [f"{where(folder, root)}: missing"]
    modules = module_files(root)
    package = f"{root.name}.{core}"
    closure = import_closure(package, modules)
    problems = [
        f"{package} loads {name}, a product module"
        for name in sorted(closure)
        if name != root.name and name != package and not name.startswith(package + ".")
    ]
    files = {modules[m] for m in closure} | set(folder.rglob("*.py"))
    lines = sum(line_count(p) for p in files)
    if lines > max_lines:
        problems.append(
            f"{where(folder, root)}: {lines} lines with its imports (at most {max_lines})"
        )
    if len(files) > max_files:
        problems.append(
            f"{where(folder, root)}: {len(files)} files with its imports (at most {max_files})"
        )
    return problems


def root_modules(root: Path = PACKAGE) -> list[str]:
    """The modules sitting loose at the package root (__init__ and __main__ included)."""
    return sorted(p.name for p in root.glob("*.py"))


def method_name_tests(root: Path = PACKAGE, names: tuple[str, ...] = METHOD_NAMES) -> list[str]:
    """`file:line: source` for each place a method's name is tested as a string: a comparison
    with one of `names` on one side (`algo == "pipe"`, `"sync" != x`), an `in` test against a
    tuple, list or set that holds one (`algo in ("sync", "pipe")`), a `case "pipe":` of a
    match, or a `.startswith("ps-")`. The lesson core is left out: it stands alone, without
    the product's table, and names its three methods where it runs them."""

    def is_name(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in names

    def holds_name(node) -> bool:
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(is_name, node.elts))

    def is_prefix(node) -> bool:
        if isinstance(node, ast.Tuple):
            return any(map(is_prefix, node.elts))
        prefixes = ("ps-", *names)
        return isinstance(node, ast.Constant) and node.value in prefixes

    found = []
    for path in sorted(root.rglob("*.py")):
        if (root / CORE) in path.parents:
            continue
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                hit = any(map(is_name, sides)) or (
                    any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
                    and any(map(holds_name, sides))
                )
            elif isinstance(node, ast.Call):
                f = node.func
                hit = (
                    isinstance(f, ast.Attribute)
                    and f.attr == "startswith"
                    and bool(node.args)
                    and is_prefix(node.args[0])
                )
            elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
                hit = is_name(node.pattern.value)
                node = node.pattern
            else:
                hit = False
            if hit:
                text = " ".join(ast.get_source_segment(source, node).split())
                found.append((path, node.lineno, node.col_offset, text))
    return [f"{where(path, root, line)}: {text}" for path, line, _, text in sorted(found)]


def imports_of_test_modules(tests: Path = TESTS) -> list[str]:
    """`file:line imports name` for each import, in any module under `tests` (test modules and
    helpers), of a test module (tests/**/test_*.py), however it is spelled: `from test_x
    import y`, `import test_x`, `from faults.test_x import y`, `from tests import test_x`."""
    stems = {p.stem for p in tests.rglob("test_*.py")}

    def is_test(module: str) -> bool:
        return bool(stems & set(module.split(".")))

    found = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                targets = [base] if is_test(base) else [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            hits = [t.lstrip(".") for t in targets if is_test(t)]
            found += [f"{where(path, tests, node.lineno)} imports {t}" for t in hits]
    return found
