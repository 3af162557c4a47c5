"""What the tests share: tolerances, small models, the tiny LightningModules, emulations, example runners.

Imported as ``from tests.support.tolerance import assert_close_scaled`` (the repository's root is on the path
wherever pytest runs, and a subprocess gets it through ``PYTHONPATH``); no test edits ``sys.path``.
"""

import os
from pathlib import Path

__all__ = ["REPO", "repo_env"]

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (the folder holding ``lightning_ig/`` and ``tests/``)."""


def repo_env() -> dict[str, str]:
    """``os.environ`` with this checkout first on ``PYTHONPATH``: a subprocess runs the code under test, installed or
    not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env
