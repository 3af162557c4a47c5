"""Reading back what a W&B offline run and an MLflow file store hold, as their own files say (no mocks).

W&B writes an offline run's history to ``run-<id>.wandb`` (its pictures as PNGs under ``files/media/images``,
named in the history rows); MLflow names each image artifact ``images/<key>+step+<step>+timestamp+<ms>+<uuid>``
with ``/`` in the key written as ``~`` and a ``+compressed.webp`` thumbnail beside each PNG (MLflow 2.13 to 2.x:
``%`` for ``+``, ``#`` for ``~``).

A test skips when a logger's package is not installed (:func:`logger_package`), never when it is installed but
fails to import: with the dev extra, these tests run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

__all__ = ["logger_package", "mlflow_pictures", "wandb_history", "wandb_pictures"]

_MLFLOW_IMAGE = re.compile(
    r"images/(?P<key>.+)(?P<sep>[+%])step(?P=sep)(?P<step>\d+)(?P=sep)timestamp(?P=sep)\d+(?P=sep)[^%+/]+\.png"
)


def logger_package(name: str) -> ModuleType:
    """``import name`` (``"wandb"``, ``"mlflow"``); the test is skipped only when the package is not installed.

    ``pytest.importorskip`` also skips on a package that is installed but does not import (a missing dependency of
    its own), which would hide a broken dev install behind a skip.
    """
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]' or '.[{name}]')")
    return importlib.import_module(name)


def wandb_history(run_file: Path) -> list[dict[str, Any]]:
    """The history rows of an offline run's ``run-<id>.wandb``: LevelDB's log format (32 KiB blocks of records
    ``crc32 (4) | length (2) | kind (1) | payload``, kinds full / first / middle / last) of ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, position, block, pending, rows = run_file.read_bytes(), 7, 32768, b"", []  # 7: the ":W&B" file header
    while position + 7 <= len(data):
        if block - position % block < 7:  # too little left in the block for a record header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        payload, position = data[position + 7 : position + 7 + length], position + 7 + length
        if kind in (2, 3):
            pending = (pending if kind == 3 else b"") + payload
            continue
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending + payload if kind == 4 else payload)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def wandb_pictures(offline_run: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Every picture of an offline run (``wandb/offline-run-<time>-<id>``) by ``(tag, trainer step)``: its
    ``path`` (the PNG in ``files/``) and the ``width`` and ``height`` the history row gives it."""
    (run_file,) = offline_run.glob("run-*.wandb")
    pictures: dict[tuple[str, int], dict[str, Any]] = {}
    for row in wandb_history(run_file):
        for key in row:
            if key.endswith("/filenames"):
                tag = key.removesuffix("/filenames")
                (name,) = row[key]
                entry = {"path": offline_run / "files" / name, "width": row[f"{tag}/width"]}
                entry["height"] = row[f"{tag}/height"]
                pictures[tag, int(row["trainer/global_step"])] = entry
    return pictures


def mlflow_pictures(client: Any, run_id: str) -> dict[tuple[str, int], str]:
    """Every PNG image artifact of an MLflow run by ``(tag, step)``: its artifact path (thumbnails left out)."""
    pictures: dict[tuple[str, int], str] = {}
    for info in client.list_artifacts(run_id, "images"):
        match = _MLFLOW_IMAGE.fullmatch(info.path)
        if match is not None:
            key = match["key"].replace("~" if match["sep"] == "+" else "#", "/")
            pictures[key, int(match["step"])] = info.path
    return pictures
