"""What a project people can adopt carries: the licence its metadata points at (LICENSE), a
citation file that validates (CITATION.cff, checked by cffconvert), `pipesgd --version`, a
changelog entry for the version pyproject declares (CHANGELOG.md) and a CI workflow
(.github/workflows/ci.yml) on Python versions the project supports."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from pipesgd_ref.commands import parser

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_licence_is_the_file_the_metadata_names():
    project = pyproject()["project"]
    assert project["license"] == "MIT", "pyproject's licence is an SPDX expression"
    assert project["license-files"], "pyproject names no licence file"
    for name in project["license-files"]:
        assert (ROOT / name).is_file(), f"pyproject names {name}, which is not in the repository"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Permission is hereby granted" in text


def cffconvert() -> str | None:
    """The cffconvert of this test's environment (beside its Python: CI runs .venv/bin/python
    without activating the environment, so PATH may not have it), else PATH's."""
    beside = Path(sys.executable).parent / "cffconvert"
    return str(beside) if beside.exists() else shutil.which("cffconvert")


def validate_citation(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(cffconvert()), "--validate", "-i", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.skipif(cffconvert() is None, reason="cffconvert is not installed")
def test_the_citation_file_validates(tmp_path):
    done = validate_citation(ROOT / "CITATION.cff")
    assert done.returncode == 0, f"CITATION.cff does not validate:\n{done.stdout}{done.stderr}"
    # and the validator does reject a file that breaks the schema
    text = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    (tmp_path / "CITATION.cff").write_text(text.replace("\nauthors:", "\nwriters:", 1))
    assert validate_citation(tmp_path / "CITATION.cff").returncode != 0


def test_the_citation_names_the_version_the_licence_and_the_paper():
    text = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    project = pyproject()["project"]
    top = dict(re.findall(r"^([a-z-]+): *(\S.*)$", text, flags=re.M))
    assert top["cff-version"] == "1.2.0"
    assert top["version"] == project["version"], "CITATION.cff and pyproject differ in version"
    assert top["license"] == project["license"]
    assert "arXiv:1811.03619" in text and "NeurIPS 2018" in text


def test_version_prints_the_package_version_and_exits_0():
    done = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pipesgd_ref {pyproject()['project']['version']}"


def test_version_falls_back_to_pyproject_where_the_package_is_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert parser.package_version() == pyproject()["project"]["version"]


def test_the_changelog_has_an_entry_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    version = pyproject()["project"]["version"]
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert releases and releases[0] == ("Unreleased", ""), "an Unreleased section comes first"
    dated = {name: date for name, date in releases[1:]}
    assert version in dated, f"CHANGELOG.md has no '## [{version}] - YYYY-MM-DD' entry"
    assert dated[version], f"the {version} entry has no release date"


WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def workflow() -> dict:
    # PyYAML comes with the dev extra (mkdocs needs it); `on:` reads as the boolean True in YAML 1.1
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    data = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))
    return data


def python_versions(job: dict) -> list[str]:
    """The Python versions a job names: its matrix's and any literal setup-python version."""
    found = [str(v) for v in job.get("strategy", {}).get("matrix", {}).get("python-version", [])]
    for step in job["steps"]:
        version = str(step.get("with", {}).get("python-version", ""))
        if step.get("uses", "").startswith("actions/setup-python") and "${{" not in version:
            found.append(version)
    return found


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def readme_test_command() -> str:
    """The line in the bash block after README's `<!-- test-command -->` marker (.ci/run's)."""
    after = (ROOT / "README.md").read_text(encoding="utf-8").split("<!-- test-command -->", 1)[1]
    return after.split("```bash\n", 1)[1].splitlines()[0]


def test_ci_runs_on_push_and_pull_requests_on_supported_pythons():
    data = workflow()
    assert {"push", "pull_request"} <= set(data["on"])
    supported = SpecifierSet(pyproject()["project"]["requires-python"])
    versions = [v for job in data["jobs"].values() for v in python_versions(job)]
    assert versions, "the workflow names no Python version"
    outside = [v for v in versions if v not in supported]
    assert not outside, f"the workflow runs Python {outside}, outside requires-python {supported}"


def test_ci_runs_the_full_suite_on_a_matrix_and_the_fast_subset_on_313():
    jobs = workflow()["jobs"].values()
    matrix = [job for job in jobs if "strategy" in job]
    assert any("bash .ci/run" in runs(job) for job in matrix), "no matrix job runs .ci/run"
    fast = [job for job in jobs if "3.13" in python_versions(job)]
    assert fast, "no job runs Python 3.13"
    install = readme_test_command().rsplit(" && ", 1)[0]  # the venv and pip install -e
    for job in fast:
        assert 'pytest -m "not slow"' in runs(job), "the 3.13 job does not run the fast subset"
        assert install in runs(job), f"the 3.13 job does not install as README does: {install}"
