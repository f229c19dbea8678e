"""What a project people can adopt carries: the licence its metadata points at (LICENSE)."""

from __future__ import annotations

import sys
from pathlib import Path

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
