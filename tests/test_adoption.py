"""What a project people can adopt carries: the licence its metadata points at (LICENSE), a
citation file that validates (CITATION.cff, checked by cffconvert), `pipesgd --version` and a
changelog entry for the version pyproject declares (CHANGELOG.md)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def validate_citation(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cffconvert", "--validate", "-i", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.skipif(shutil.which("cffconvert") is None, reason="cffconvert is not installed")
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
