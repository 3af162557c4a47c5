"""``lightning-ig diag`` in process, and its report read back and validated against the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from lightning_ig import cli
from lightning_ig.views.report import load_schema


def run_diag(checkpoint: Path, output: Path, *flags: str) -> int:
    """The exit status of ``diag --checkpoint CHECKPOINT --output OUTPUT FLAGS...``."""
    return cli.main(["diag", "--checkpoint", str(checkpoint), "--output", str(output), *flags])


def read_valid_report(path: Path) -> dict[str, Any]:
    """The report at ``path``, after checking it against the schema."""
    report = json.loads(path.read_text())
    jsonschema.validate(report, load_schema())
    return report
