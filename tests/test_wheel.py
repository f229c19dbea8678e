"""The package a pip user gets: the sdist and the wheel built from this checkout, checked by
twine, the wheel installed into a fresh virtual environment and run from a folder outside
the checkout (compare --quick, train --preset tiny, bench allreduce, --version), and the
tutorials copied out of it by `pipesgd tutorials DIR` and run from there.

The fresh environment has no site packages of its own but the wheel: the test environment's
site-packages folders are listed in a .pth file of it, so numpy, numba and scikit-learn come
without a network, while the checkout's editable install (a finder that a .pth file of the
test environment starts) is never started there; each run asserts that the pipesgd_ref it
imported is the wheel's. The fast tests here: pyproject names every package, and the
tutorials command's refusals, from the checkout.
"""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from pipesgd_ref.commands.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipesgd_ref"
TUTORIALS = ROOT / "tutorials"
CACHE_SUFFIXES = (".pyc", ".nbi", ".nbc")  # Python's and Numba's caches, never shipped
FAST_TUTORIAL = "01_data_parallel_sgd"  # about 3 s at its small size (tests/test_tutorials.py)


def source_packages() -> set[str]:
    """Every package of the source tree (a folder with __init__.py), dotted."""
    return {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }


def package_files() -> set[str]:
    """Every file of pipesgd_ref/ a wheel must carry (its modules and its data files: the
    fitted AllReduce models, ...), and the tutorials it ships as pipesgd_ref/_tutorials."""
    files = {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in CACHE_SUFFIXES
    }
    shipped = [*TUTORIALS.glob("*.py"), *TUTORIALS.glob("*.ipynb")]
    return files | {f"pipesgd_ref/_tutorials/{p.name}" for p in shipped}


def test_pyproject_names_every_package_and_ships_the_tutorials():
    """pyproject lists the packages by name (so that tutorials/ can ship inside the package):
    a package folder missing from the list would be missing from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    listed = set(setuptools["packages"])
    want = source_packages() | {"pipesgd_ref._tutorials"}
    assert listed == want, (
        f"pyproject's [tool.setuptools] packages lacks {sorted(want - listed)} and names "
        f"{sorted(listed - want)} that is no package folder: list every package of pipesgd_ref"
    )
    assert setuptools["package-dir"] == {"pipesgd_ref._tutorials": "tutorials"}
    assert setuptools["package-data"]["pipesgd_ref._tutorials"] == ["*.ipynb"]


# --- pipesgd tutorials DIR, from the checkout ---------------------------------------------------


def test_tutorials_copies_every_script_and_notebook(tmp_path, capsys):
    target = tmp_path / "new" / "lessons"
    assert main(["tutorials", str(target)]) == 0
    want = sorted(p.name for p in [*TUTORIALS.glob("*.py"), *TUTORIALS.glob("*.ipynb")])
    assert sorted(p.name for p in target.iterdir()) == want
    for name in want:
        assert (target / name).read_bytes() == (TUTORIALS / name).read_bytes(), name
    out = capsys.readouterr().out
    assert f"wrote {len(want)} files to {target}" in out
    assert f"PIPESGD_TUTORIAL_SMALL=1 python {FAST_TUTORIAL}.py" in out


def test_tutorials_refuses_a_folder_that_holds_files_unless_overwrite(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / f"{FAST_TUTORIAL}.py").write_text("# my edits")
    assert main(["tutorials", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--overwrite" in err
    assert (tmp_path / f"{FAST_TUTORIAL}.py").read_text() == "# my edits"  # nothing written
    assert main(["tutorials", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / f"{FAST_TUTORIAL}.py").read_bytes() == (
        TUTORIALS / f"{FAST_TUTORIAL}.py"
    ).read_bytes()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # the user's other files stay


@pytest.mark.parametrize("what", ["a file", "empty", "a config key"])
def test_tutorials_refuses_what_is_no_folder_in_one_line(tmp_path, capsys, what):
    args = {
        "a file": [str(tmp_path / "f")],
        "empty": [""],
        "a config key": [str(tmp_path / "d"), "--lr=0.1"],
    }[what]
    (tmp_path / "f").write_text("x")
    try:
        rc = main(["tutorials", *args])
    except SystemExit as e:  # argparse's usage errors exit
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesgd: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "d").exists()


# --- the wheel, installed into a fresh environment ---------------------------------------------


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


class Installed:
    """The built sdist and wheel, and a fresh virtual environment holding the wheel."""

    def __init__(self, base: Path) -> None:
        self.dist = base / "dist"
        self.venv = base / "venv"
        self.work = base / "work"  # every command's working folder: outside the checkout
        self.work.mkdir()
        self.bin = self.venv / "bin"
        # conftest points auto's figures at the checkout's: the wheel reads its own
        dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        dropped += ("PIPESGD_ALLREDUCE_MODELS",)
        self.env = {k: v for k, v in os.environ.items() if k not in dropped}
        self.env.update(
            PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONNOUSERSITE="1",  # the user's site comes only through the .pth, if at all
            MPLBACKEND="Agg",
        )

    def build(self) -> None:
        """`python -m build`: the sdist, then the wheel built from the sdist (what a user of
        either gets), with this environment's setuptools (no network)."""
        cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(self.dist)]
        _run([*cmd, str(ROOT)], self.work, {**os.environ}, timeout=240)

    def sdist(self) -> Path:
        return next(self.dist.glob("pipesgd_ref-*.tar.gz"))

    def wheel(self) -> Path:
        return next(self.dist.glob("pipesgd_ref-*.whl"))

    def install(self) -> None:
        _run([sys.executable, "-m", "venv", str(self.venv)], self.work, self.env, timeout=120)
        self.site = Path(self.python("import sysconfig; print(sysconfig.get_paths()['purelib'])"))
        # the test environment's dependencies, by path: a directory named in a .pth file is
        # put on sys.path, its own .pth files (the editable install's finder) never run
        ours = [*site.getsitepackages(), site.getusersitepackages()]
        deps = [p for p in dict.fromkeys(ours) if p in sys.path and Path(p).is_dir()]
        (self.site / "_pipesgd_test_deps.pth").write_text("\n".join(deps) + "\n")
        pip = [str(self.bin / "python"), "-m", "pip", "install", "--no-deps", "--no-index"]
        _run([*pip, str(self.wheel())], self.work, self.env, timeout=120)

    def python(self, code: str) -> str:
        return _run([str(self.bin / "python"), "-c", code], self.work, self.env, 60).stdout.strip()

    def pipesgd(self, *args: str, timeout: float = 120, cwd: Path | None = None, **env) -> str:
        """A command of the wheel's `pipesgd`; its output. Fails on a non-zero exit."""
        cmd = [str(self.bin / "pipesgd"), *args]
        return _run(cmd, cwd or self.work, {**self.env, **env}, timeout).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    for tool, why in (("build", "the dev extra's build"), ("setuptools", "the build backend")):
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"{tool} is not installed ({why}): pip install -e '.[dev]'")
    base = tmp_path_factory.mktemp("wheel")
    assert ROOT not in base.resolve().parents, "the wheel's tests must run outside the checkout"
    inst = Installed(base)
    start = time.perf_counter()
    inst.build()
    inst.install()
    inst.setup_s = time.perf_counter() - start
    return inst


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sdist_and_the_wheel_carry_every_package_file_and_the_tutorials(installed):
    want = package_files()
    with zipfile.ZipFile(installed.wheel()) as whl:
        shipped = {n for n in whl.namelist() if n.startswith("pipesgd_ref/")}
    assert want - shipped == set(), f"the wheel lacks {sorted(want - shipped)}"
    assert shipped - want == set(), f"the wheel carries files of no source: {shipped - want}"
    with tarfile.open(installed.sdist()) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    tutorials = {
        f"tutorials/{p.name}" for p in [*TUTORIALS.glob("*.py"), *TUTORIALS.glob("*.ipynb")]
    }
    assert tutorials | {"LICENSE", "README.md", "pyproject.toml"} <= names
    assert not any(n.startswith("tutorials/out/") for n in names), "the sdist ships figures"
    # What a packager needs to run the tests from the sdist: every test with its conftest and
    # helpers, and the docs, benchmarks and project files the tests read (MANIFEST.in).
    tree = {
        str(p.relative_to(ROOT))
        for top in ("tests", "docs", "benchmarks", ".github", ".ci")
        for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in CACHE_SUFFIXES
    }
    tree |= {"CHANGELOG.md", "CITATION.cff", "tests/conftest.py"}
    assert tree - names == set(), f"the sdist lacks {sorted(tree - names)}"


@pytest.mark.slow
def test_twine_passes_the_sdist_and_the_wheel(installed):
    if importlib.util.find_spec("twine") is None:
        pytest.skip("twine is not installed (the dev extra): pip install -e '.[dev]'")
    cmd = [sys.executable, "-m", "twine", "check", "--strict"]
    done = _run(
        [*cmd, str(installed.sdist()), str(installed.wheel())], installed.work, {**os.environ}, 120
    )
    assert done.stdout.count("PASSED") == 2, done.stdout


@pytest.mark.slow
def test_the_environment_imports_the_wheel_not_the_checkout(installed):
    where = Path(installed.python("import pipesgd_ref; print(pipesgd_ref.__file__)"))
    assert where == installed.site / "pipesgd_ref" / "__init__.py", where
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert installed.pipesgd("--version").strip() == f"pipesgd_ref {version['version']}"


@pytest.mark.slow
def test_the_wheel_trains_the_tiny_preset(installed):
    out = installed.pipesgd("train", "--preset", "tiny", "--no-progress", "--out", "tiny")
    assert "test accuracy" in out, out
    assert (installed.work / "tiny" / "summary.json").is_file()
    # --allreduce auto reads the fitted models the wheel ships (comm/allreduce_models.json)
    assert "gradients reduced by" in out, out


@pytest.mark.slow
def test_the_wheel_benchmarks_the_allreduce(installed):
    out = installed.pipesgd(
        "bench", "allreduce", "--world-size", "2", "--sizes", "4KB,64KB", "--reps", "3",
        "--warmup", "1", "--rounds", "1", "--peers", "none", "--transport", "tcp",
    )  # fmt: skip
    assert "auto-tcp (" in out and "64.0 KB" in out, out  # auto picked by the shipped models


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_runs_compare_quick(installed):
    out = installed.pipesgd("compare", "--quick", "--no-progress", timeout=240)
    assert "compare: done" in out, out
    assert (installed.work / "runs" / "compare" / "compare.json").is_file()


@pytest.mark.slow
def test_the_wheel_copies_the_tutorials_and_one_runs_from_the_copy(installed):
    target = installed.work / "my-tutorials"
    out = installed.pipesgd("tutorials", str(target))
    assert f"wrote {len(list(target.iterdir()))} files to {target}" in out
    script = target / f"{FAST_TUTORIAL}.py"
    assert script.read_bytes() == (TUTORIALS / script.name).read_bytes()
    assert (target / f"{FAST_TUTORIAL}.ipynb").is_file()
    cmd = [str(installed.bin / "python"), script.name]
    env = {**installed.env, "PIPESGD_TUTORIAL_SMALL": "1"}
    _run(cmd, target, env, timeout=240)
    figures = list((target / "out").glob("01_*.png"))
    has_matplotlib = installed.python(
        "import importlib.util as u; print(bool(u.find_spec('matplotlib')))"
    )
    assert figures or has_matplotlib == "False", "the tutorial drew no figure into DIR/out"
