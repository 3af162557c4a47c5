"""Running the examples as a user does (a subprocess with this checkout on the path), or importing one as a module."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.support import REPO


def example_env() -> dict[str, str]:
    """The environment of an example run: headless matplotlib, the checkout first on the path."""
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    # The package may be installed or only on the path of a checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_python(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``; the caller checks the return code."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=example_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def only_run_dir(runs: Path) -> Path:
    """The one run folder an example wrote under ``runs``."""
    run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1, f"expected one run folder in {runs}, found {run_dirs}"
    return run_dirs[0]


def load_example(path: Path, name: str) -> ModuleType:
    """The example script at ``path`` imported as module ``name`` (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def assert_gpu_refused_without_a_gpu(
    example: ModuleType,
    script: str,
    runs: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--accelerator gpu`` where torch sees no GPU: exit 2 with the example's one-line error, nothing made first."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--accelerator", "gpu", "--runs-dir", str(runs)])
    assert exit_info.value.code == 2
    assert f"{script}: error: --accelerator gpu, but torch sees no CUDA GPU" in capsys.readouterr().err
    assert not runs.exists(), "nothing is made before the message"
