"""The version is written once: the package, and the build (pyproject.toml reads the module), say the same."""

from __future__ import annotations

import re

import pytest

import lightning_ig
from lightning_ig._version import __version__
from tests.support import REPO


def test_the_package_exports_the_modules_version() -> None:
    assert lightning_ig.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", __version__), __version__


def test_the_build_reads_the_version_from_the_module() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["hatch"]["version"]["path"] == "lightning_ig/_version.py"
