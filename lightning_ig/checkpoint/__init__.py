"""Safetensors checkpoints that rebuild their own model: architecture, config, feature names, held-out states.

One safetensors file: the model's ``state_dict()`` under its own keys, the held-out states (float32) as
``__states__``, and in the metadata (``str -> str``) the format's version, the architecture's registered name (or an
import path, followed only on the reader's say-so), its config as JSON and the feature names (:mod:`.layout`'s keys),
beside any metadata of the user's own. A *merged* file holds several heads, each under the prefix ``<head>__``
(:func:`save_merged_checkpoint`, :func:`merge_checkpoints`); ``prefix="trending__"`` loads one head exactly like a
single-model file. The layout in full: ``docs/ARCHITECTURE.md`` (contracts).

Writes are atomic (:mod:`.writing`). A checkpoint is data: reading one never unpickles and never imports what the
file names, and its config may not describe a model larger than the tensors it stores (:func:`load_checkpoint`).

The parts: :mod:`.layout` (keys, :class:`CheckpointError`, :class:`LoadedCheckpoint`), :mod:`.writing` (save and merge),
:mod:`.heads` (which heads a file holds, which one a prefix selects), :mod:`.building` (the model a file describes:
names, then sizes, then memory), :mod:`.reading` (rebuild a model), :mod:`.states` (states files).
"""

from __future__ import annotations

from lightning_ig.checkpoint.heads import list_heads
from lightning_ig.checkpoint.layout import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    FEATURE_NAMES_KEY,
    FORMAT_KEY,
    FORMAT_VERSION,
    HEAD_SEPARATOR,
    HEADS_KEY,
    STATES_KEY,
    CheckpointError,
    LoadedCheckpoint,
    head_prefix,
    read_metadata,
)
from lightning_ig.checkpoint.reading import load_checkpoint, load_lightning_checkpoint
from lightning_ig.checkpoint.states import STATE_SUFFIXES, load_states, states_beside
from lightning_ig.checkpoint.writing import merge_checkpoints, save_checkpoint, save_merged_checkpoint

__all__ = [
    "ARCHITECTURE_KEY",
    "CONFIG_KEY",
    "FEATURE_NAMES_KEY",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "HEADS_KEY",
    "HEAD_SEPARATOR",
    "STATES_KEY",
    "STATE_SUFFIXES",
    "CheckpointError",
    "LoadedCheckpoint",
    "head_prefix",
    "list_heads",
    "load_checkpoint",
    "load_lightning_checkpoint",
    "load_states",
    "merge_checkpoints",
    "read_metadata",
    "save_checkpoint",
    "save_merged_checkpoint",
    "states_beside",
]
