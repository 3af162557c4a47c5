"""Safetensors checkpoints that rebuild their own model: architecture, config, feature names, held-out states.

File layout (one safetensors file):

* tensors: the model's ``state_dict()`` under its own keys, plus the held-out
  states, if any, as the float32 tensor ``__states__`` ``(num_states, *feature_shape)``;
* metadata (safetensors allows only ``str -> str``):

  ========================== ==========================================================
  ``lightning_ig.format``    ``"1"``
  ``lightning_ig.architecture`` a registered model name (``"DuelingQNetwork"``) or an
                             import path ``"package.module:Class"`` (followed only on
                             the reader's say-so)
  ``lightning_ig.config``    the constructor's keyword arguments, JSON
  ``lightning_ig.feature_names`` JSON array of names, one per input feature (optional)
  ========================== ==========================================================

  plus any metadata of the user's own.

A *merged* file holds several heads, each under a prefix ``<head>__`` (for example ``trending__value.0.weight_mu`` and
``ranging__value.0.weight_mu``), the head's own states as ``<head>____states__`` (its prefix + ``__states__``), and
per-head architecture, config and feature names in ``lightning_ig.heads``, a JSON object ``{"<head>": {"architecture":
..., "config": {...}, "feature_names": [...]}}``. Loading with ``prefix="trending__"`` reads only the keys under that
prefix and strips it, so a head loads exactly like a single-model file. A head without its own entry or states falls
back on the file-level ones. Write merged files with :func:`save_merged_checkpoint` (models) or
:func:`merge_checkpoints` (files).

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
