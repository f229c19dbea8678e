"""The package's shape: layers import downwards only, each module keeps its private names, and
the pieces stay small enough for a reader to follow.

Checked from the source (Python's `ast`, so nothing is imported and nothing runs):

    no import cycle inside pipesgd_ref
        counting the imports inside functions too: a lazy import that only exists to break a
        cycle still ties the two modules together for a reader, who must read both at once.
    no `_private` name imported from another module
        a name with a leading underscore is the module's own business; a helper that another
        module needs is public, named and documented where it lives.
    no module over 500 lines, no function over 80
        a module is read in one sitting and a function without scrolling.
    methods/pipe.py within 200 lines, importing no checkpoint, lifetime or faults module
        one Pipe-SGD step is read in one file: the loop, with the product around it reached
        through the hooks the runtime hands it.
    at most 10 modules loose at the package root
        the folders (methods, comm, runtime, commands, ...) are the map of the package.
    a method's name compared as a string at most 8 times
        what a method is lives in its row of methods/table.py; code asks the row.
    no test module imports another test module
        shared helpers live in helper modules (tests/oracles.py, jobs.py, procs.py, ...): a
        test module imported by another is collected twice, and broke collection once.

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

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "pipesgd_ref"


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
    assert not found, (
        "import cycles inside pipesgd_ref (break each by moving the shared piece down a "
        "layer):\n" + "\n".join(" <-> ".join(c) for c in found)
    )


def test_no_private_name_crosses_modules():
    found = private_imports(module_files())
    assert not found, (
        "private names imported from another module (make them public where they live, or "
        "move them):\n" + "\n".join(found)
    )


@pytest.mark.slow
def test_every_module_imports_alone():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    quiet = dict(stderr=subprocess.PIPE, text=True)
    names = [m for m in module_files() if not m.endswith("__main__")]
    # One fresh interpreter per module, a few at a time: an import that only works after
    # another module was imported first fails here.
    failed = []
    for start in range(0, len(names), 8):
        batch = names[start : start + 8]
        procs = [
            (m, subprocess.Popen([sys.executable, "-c", f"import {m}"], env=env, **quiet))
            for m in batch
        ]
        for m, proc in procs:
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failed.append(f"{m}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    assert not failed, "modules that do not import alone:\n" + "\n".join(failed)


# --- small pieces ------------------------------------------------------------------------------

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
PIPE_LOOP = "methods/pipe.py"
MAX_PIPE_LINES = 200
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
    root: Path = PACKAGE,
    loop: str = PIPE_LOOP,
    limit: int = MAX_PIPE_LINES,
    forbidden: tuple[str, ...] = NOT_IN_PIPE,
) -> list[str]:
    """What keeps the loop `loop` (a path under `root`) from reading as the algorithm alone:
    more than `limit` lines, and each import of a `forbidden` module (names under `root`)."""
    path = root / loop
    if not path.is_file():
        return [f"{where(path, root)}: missing"]
    problems = []
    if (n := line_count(path)) > limit:
        problems.append(f"{where(path, root)}: {n} lines (at most {limit})")
    modules = module_files(root)
    name = next(m for m, p in modules.items() if p == path)
    banned = {f"{root.name}.{m}" for m in forbidden}
    for target, _, line in imports_of(name, path, modules):
        if target in banned:
            problems.append(f"{where(path, root, line)}: imports {target}")
    return problems


def root_modules(root: Path = PACKAGE) -> list[str]:
    """The modules sitting loose at the package root (__init__ and __main__ included)."""
    return sorted(p.name for p in root.glob("*.py"))


def method_name_tests(root: Path = PACKAGE, names: tuple[str, ...] = METHOD_NAMES) -> list[str]:
    """`file:line: source` for each place a method's name is tested as a string: a comparison
    with one of `names` on one side (`algo == "pipe"`, `"sync" != x`), an `in` test against a
    tuple, list or set that holds one (`algo in ("sync", "pipe")`), a `case "pipe":` of a
    match, or a `.startswith("ps-")`."""

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


def fail_listing(found: list[str], why: str) -> None:
    """Fail the test with `why` (what the rule is for, and how to meet it) and one line per
    place that breaks it; no traceback: the list is the report."""
    pytest.fail(why + ":\n" + "\n".join(found), pytrace=False)


def check_module_sizes(root: Path = PACKAGE) -> None:
    if found := oversized_modules(root):
        fail_listing(
            found,
            f"modules over {MAX_MODULE_LINES} lines: a reader takes a module in "
            "one sitting. Split each by idea (one idea per file, named for it), not at "
            "an arbitrary line",
        )


def check_function_sizes(root: Path = PACKAGE) -> None:
    if found := long_functions(root):
        fail_listing(
            found,
            f"functions over {MAX_FUNCTION_LINES} lines (def line to last "
            "line): a function read without scrolling shows its steps. Name each step "
            "as a function of its own, or move what is not the function's idea (checks, "
            "logging, bookkeeping) out of it",
        )


def check_pipe_loop(root: Path = PACKAGE) -> None:
    if found := loop_problems(root):
        fail_listing(
            found,
            f"{PIPE_LOOP} is one Pipe-SGD step for a reader to follow in one "
            "file: compute the gradient of step t while the AllReduce of step t-1 "
            f"runs, then apply it. At most {MAX_PIPE_LINES} lines; checkpoints, "
            "signals and fault injection reach the loop through the hooks the runtime "
            "hands it, never imported by it",
        )


def check_root_modules(root: Path = PACKAGE) -> None:
    if len(found := root_modules(root)) > MAX_ROOT_MODULES:
        fail_listing(
            found,
            f"{len(found)} modules loose in {root.name}/ (at most "
            f"{MAX_ROOT_MODULES}, __init__ and __main__ included): the folders are the "
            "map of the package (methods/, comm/, runtime/, commands/, models/, ...). "
            "Move each module into the folder of the layer it belongs to",
        )


def check_method_names(root: Path = PACKAGE) -> None:
    if len(found := method_name_tests(root)) > MAX_NAME_TESTS:
        fail_listing(
            found,
            f"a method's name is tested as a string in {len(found)} places (at "
            f"most {MAX_NAME_TESTS}): what a method is (its server, pipelining, "
            "staleness, options, weight copies) lives in its row of methods/table.py. "
            "Ask the row (`method(cfg.algo).server`), so that adding a method stays "
            "one file and one row",
        )


def check_test_imports(tests: Path = TESTS) -> None:
    if found := imports_of_test_modules(tests):
        fail_listing(
            found,
            "test modules imported by another module under tests/: pytest "
            "collects each test module on its own, so one imported by another ties "
            "the two together (a broken import stops the collection of both). Move "
            "what they share into a helper module (tests/oracles.py, strategies.py, "
            "jobs.py, procs.py)",
        )


def test_no_module_over_500_lines():
    check_module_sizes()


def test_no_function_over_80_lines():
    check_function_sizes()


def test_the_pipe_loop_is_the_algorithm():
    check_pipe_loop()


def test_at_most_10_modules_at_the_package_root():
    check_root_modules()


def test_method_names_are_rarely_compared_as_strings():
    check_method_names()


def test_no_test_module_imports_another():
    check_test_imports()


# --- each check fails on a made-up package that breaks its rule, naming what is over ----------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def failure(check, root: Path) -> list[str]:
    """The lines `check(root)` reports after its explanation; fails if the check passes."""
    with pytest.raises(pytest.fail.Exception) as info:
        check(root)
    return str(info.value).split(":\n", 1)[1].splitlines()


def test_the_size_checks_find_a_long_module_and_a_long_function(tmp_path):
    pkg = tmp_path / "demo"
    write(pkg / "__init__.py", "")
    write(pkg / "sub" / "big.py", "x = 1\n" * 501)
    body = "".join(f"        y{i} = {i}\n" for i in range(80))  # 81 lines with the def
    write(pkg / "funcs.py", f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}")
    assert failure(check_module_sizes, pkg) == ["demo/sub/big.py: 501 lines"]
    assert failure(check_function_sizes, pkg) == ["demo/funcs.py:6 long: 81 lines"]
    write(pkg / "sub" / "big.py", "x = 1\n" * 500)
    write(pkg / "funcs.py", f"class C:\n    def f(self):\n{body[: body.rindex('        y79')]}")
    check_module_sizes(pkg)
    check_function_sizes(pkg)


def test_the_loop_check_finds_a_long_loop_and_its_product_imports(tmp_path):
    pkg = tmp_path / "demo"
    write(pkg / "__init__.py", "")
    for name in ("__init__", "checkpoint", "lifetime", "faults", "hooks"):
        write(pkg / "runtime" / f"{name}.py", "")
    imports = (
        "from demo.runtime import checkpoint\n"
        "from demo.runtime.hooks import x\n"
        "def loop():\n"
        "    from ..runtime import faults\n"
        "    import demo.runtime.lifetime\n"
    )
    write(pkg / "methods" / "__init__.py", "")
    write(pkg / "methods" / "pipe.py", imports + "\n" * 196)
    assert failure(check_pipe_loop, pkg) == [
        "demo/methods/pipe.py: 201 lines (at most 200)",
        "demo/methods/pipe.py:1: imports demo.runtime.checkpoint",
        "demo/methods/pipe.py:4: imports demo.runtime.faults",
        "demo/methods/pipe.py:5: imports demo.runtime.lifetime",
    ]
    write(pkg / "methods" / "pipe.py", "from demo.runtime.hooks import x\n" + "\n" * 199)
    check_pipe_loop(pkg)


def test_the_root_check_counts_the_loose_modules(tmp_path):
    pkg = tmp_path / "demo"
    for name in ("__init__", "__main__", *"abcdefgh"):
        write(pkg / f"{name}.py", "")
    write(pkg / "sub" / "c.py", "")
    write(pkg / "notes.txt", "")
    check_root_modules(pkg)  # ten
    write(pkg / "i.py", "")
    found = failure(check_root_modules, pkg)
    assert found == ["__init__.py", "__main__.py", *(f"{c}.py" for c in "abcdefghi")]


def test_the_name_check_finds_each_way_of_testing_a_method_name(tmp_path):
    pkg = tmp_path / "demo"
    write(pkg / "__init__.py", "")
    lines = [
        'TABLE = {"sync": 1, "pipe": 2}',  # a table, not a test
        "def f(algo, other):",
        '    if algo == "pipe" or "sync" != algo:',
        "        return TABLE[algo]",
        '    if algo in ("ps-sync", "ps-async") and algo not in ["ddp"]:',
        "        return 1",
        '    if algo.startswith("ps-") or other == "ps" or other in ("a", "b"):',
        "        return 2",
        "    match algo:",
        '        case "ddp":',
        "            return 3",
    ]
    write(pkg / "m.py", "\n".join(lines) + "\n")
    want = [
        'demo/m.py:3: algo == "pipe"',
        'demo/m.py:3: "sync" != algo',
        'demo/m.py:5: algo in ("ps-sync", "ps-async")',
        'demo/m.py:5: algo not in ["ddp"]',
        'demo/m.py:7: algo.startswith("ps-")',
        'demo/m.py:10: "ddp"',
    ]
    assert method_name_tests(pkg) == want
    check_method_names(pkg)  # six: within the bound
    write(pkg / "n.py", "\n".join(lines) + "\n")
    assert failure(check_method_names, pkg) == want + [w.replace("m.py", "n.py") for w in want]


def test_the_test_import_check_finds_a_test_module_imported(tmp_path):
    tests = tmp_path / "tests"
    write(tests / "helpers.py", "import json\n")
    write(tests / "test_a.py", "from helpers import x\nimport pytest\n")
    write(tests / "faults" / "test_c.py", "from helpers import x\n")
    check_test_imports(tests)
    write(tests / "test_a.py", "from helpers import x\nfrom test_b import y\n")
    write(tests / "test_b.py", "import test_a, os\nfrom tests import test_c\n")
    write(tests / "faults" / "test_c.py", "from faults.test_c import z\nfrom test_a import w\n")
    assert failure(check_test_imports, tests) == [
        "tests/faults/test_c.py:1 imports faults.test_c",
        "tests/faults/test_c.py:2 imports test_a",
        "tests/test_a.py:2 imports test_b",
        "tests/test_b.py:1 imports test_a",
        "tests/test_b.py:2 imports tests.test_c",
    ]
