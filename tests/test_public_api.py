"""The public API: every exported name resolves, and importing the package stays light."""

from __future__ import annotations

import subprocess
import sys

import lightning_ig


def test_every_exported_name_resolves() -> None:
    for name in lightning_ig.__all__:
        assert getattr(lightning_ig, name) is not None, name
    assert sorted(dir(lightning_ig)) == sorted(lightning_ig.__all__)


def test_unknown_names_raise_attribute_error() -> None:
    try:
        lightning_ig.not_a_name  # noqa: B018
    except AttributeError as error:
        assert "not_a_name" in str(error)
    else:  # pragma: no cover - the branch the test exists to catch
        raise AssertionError("lightning_ig.not_a_name did not raise")


def test_importing_the_package_does_not_import_lightning_or_cupy() -> None:
    code = "import sys, lightning_ig; print(any(m.split('.')[0] in ('lightning', 'cupy', 'matplotlib') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
