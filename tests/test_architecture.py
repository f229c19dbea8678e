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
    methods/pipe.py importing no checkpoint, lifetime or faults module
        the product's Pipe-SGD step is read as a loop, with the product around it reached
        through the hooks the runtime hands it.
    the lesson core (pipesgd_ref/core) within 900 lines and 8 files, its imports included,
    loading no product module
        the whole method is read in one sitting, and what is read is everything that runs.
    at most 10 modules loose at the package root
        the folders (methods, comm, runtime, commands, ...) are the map of the package.
    a method's name compared as a string at most 8 times
        what a method is lives in its row of methods/table.py; code asks the row.
    no test module imports another test module
        shared helpers live in helper modules (tests/oracles.py, jobs.py, procs.py, ...): a
        test module imported by another ties the two together, and stopped collection once.

The finders live in tests/source_shape.py; each check below is shown failing on a made-up
package that breaks its rule. And every module imports on its own in a fresh interpreter
(`python -c "import M"`), which is what a user, a tutorial or a spawned worker does first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from source_shape import (
    MAX_CORE_FILES,
    MAX_CORE_LINES,
    MAX_FUNCTION_LINES,
    MAX_MODULE_LINES,
    MAX_NAME_TESTS,
    MAX_ROOT_MODULES,
    PACKAGE,
    PIPE_LOOP,
    TESTS,
    core_problems,
    cycles,
    import_graph,
    imports_of_test_modules,
    long_functions,
    loop_problems,
    method_name_tests,
    module_files,
    oversized_modules,
    private_imports,
    root_modules,
)


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
            f"{PIPE_LOOP} is the product's Pipe-SGD step: compute the gradient of step t "
            "while the AllReduce of step t-1 runs, then apply it. Checkpoints, signals and "
            "fault injection reach the loop through the hooks the runtime hands it, never "
            "imported by it",
        )


def check_core(root: Path = PACKAGE) -> None:
    if found := core_problems(root):
        fail_listing(
            found,
            f"the lesson core is the whole method read in one sitting: at most "
            f"{MAX_CORE_LINES} lines in at most {MAX_CORE_FILES} files, counting every module "
            "importing it loads, and no product module among them (NumPy and the standard "
            "library only). Move product concerns out of it, into the product",
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


def test_the_lesson_core_is_small_and_alone():
    check_core()


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
        "demo/methods/pipe.py:1: imports demo.runtime.checkpoint",
        "demo/methods/pipe.py:4: imports demo.runtime.faults",
        "demo/methods/pipe.py:5: imports demo.runtime.lifetime",
    ]
    write(pkg / "methods" / "pipe.py", "from demo.runtime.hooks import x\n" + "\n" * 199)
    check_pipe_loop(pkg)


def test_the_core_check_counts_lines_files_and_imports(tmp_path):
    pkg = tmp_path / "demo"
    write(pkg / "__init__.py", "\n" * 10)
    write(pkg / "product.py", "\n" * 50)
    write(pkg / "core" / "__init__.py", "from demo.core.ring import x\n")
    write(pkg / "core" / "ring.py", "def f():\n    from demo import product\n" + "\n" * 897)
    assert failure(check_core, pkg) == [
        "demo.core loads demo.product, a product module",
        "demo/core: 960 lines with its imports (at most 900)",
    ]
    write(pkg / "core" / "ring.py", "x = 1\n" + "\n" * 880)
    for i in range(6):
        write(pkg / "core" / f"m{i}.py", "")
    assert failure(check_core, pkg) == ["demo/core: 9 files with its imports (at most 8)"]
    (pkg / "core" / "m5.py").unlink()
    check_core(pkg)  # 892 lines in 8 files: the package's __init__, core's 7


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
