"""Building the model a checkpoint describes, without trusting the file: names first, then sizes, then memory.

A checkpoint's metadata is data written by whoever made the file. Two things in it
could make a reader do harm, and both are checked before the model is built:

* **Names.** Only registered architectures are built from a file's metadata (:func:`~lightning_ig.models.build_model`
  with ``allow_import=False``, which holds for the names inside the config too). An import path the file names is
  followed only when the caller opts in.
* **Sizes.** The model is first built on the ``meta`` device, which allocates nothing, and its parameters and buffers
  are counted against the tensors the file actually stores (their shapes are read from the header, not their data). A
  config that asks for more than the file holds is refused with both sizes; the state-dict shapes must match the file's
  exactly. Only then is the model built for real. While any build runs, a registration hook counts the tensors made and
  stops a build that makes far more than the file holds (a config with a hundred thousand tiny layers takes no time to
  refuse), and stops any build, meta or not, as soon as the real memory it has taken passes the same bound. A class
  whose constructor cannot run on the meta device (it reads tensor values) is built for real under that bound and
  checked after.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from lightning_ig.checkpoint.layout import HEAD_SEPARATOR, STATES_KEY, CheckpointError, few, open_safetensors
from lightning_ig.models.registry import UnregisteredModelError, build_model, resolve_model_class
from lightning_ig.vocabulary import shown, size_text

__all__ = [
    "NUMEL_SLACK",
    "TENSOR_SLACK",
    "Recipe",
    "StoredTensors",
    "build_checked",
    "shape_mismatch",
    "state_shapes",
    "states_key",
    "stored_tensors",
    "weight_keys",
]

#: How many more tensors than the file stores a build may make (buffers a file does not keep, re-assigned layers).
TENSOR_SLACK = 64
#: How many more values than the file stores a model may hold (non-persistent buffers: tables, caches).
NUMEL_SLACK = 2**20


@dataclass
class Recipe:
    """What the metadata (or the caller's overrides) say about the model to build, and who said it."""

    architecture: str
    config: dict[str, Any]
    feature_names: list[str] | None
    architecture_from_caller: bool = False  # the caller's architecture= / --model: the caller's own words
    config_from_caller: bool = False  # the caller's config= / --model-kwargs

    @property
    def described(self) -> str:
        """The model as messages name it, once its name has resolved: ``DuelingQNetwork with config {...}``."""
        return f"{self.architecture[:120]} with config {shown(self.config)}"


@dataclass
class StoredTensors:
    """The shapes of a model's tensors in a file (model keys, the prefix stripped), read without their data."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    prefix: str = ""  # stripped from the file's keys
    nbytes: int = 0  # as stored, the states that loading reads included

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())

    def limits(self) -> tuple[int, int]:
        """The most tensors and values a model built for these weights may hold."""
        return 2 * self.count + TENSOR_SLACK, 2 * self.numel + NUMEL_SLACK


def weight_keys(keys: list[str], prefix: str | None) -> dict[str, str]:
    """File key -> model key for the model's tensors: under ``prefix`` (stripped), neither states nor reserved."""
    selected = keys if prefix is None else [key for key in keys if key.startswith(prefix)]
    own_states_key = (prefix or "") + STATES_KEY
    return {
        key: key[len(prefix or "") :]
        for key in selected
        if key != own_states_key and not key.startswith(HEAD_SEPARATOR)  # other tensors reserved by this format
    }


def states_key(keys: list[str], prefix: str | None) -> str | None:
    """The key of the states a load reads: the head's own, else the file's shared ones (``None``: neither)."""
    return next((key for key in ((prefix or "") + STATES_KEY, STATES_KEY) if key in keys), None)


def stored_tensors(file: Path, keys: list[str], prefix: str | None) -> StoredTensors:
    """The shapes of the model's tensors in ``file``, and the bytes of those and of the states that loading reads,
    from the header (no tensor data is read)."""
    stored, weights, states = StoredTensors(prefix=prefix or ""), weight_keys(keys, prefix), states_key(keys, prefix)
    with open_safetensors(file) as handle:
        for key in [*weights, *([] if states is None else [states])]:
            header = handle.get_slice(key)
            shape = tuple(int(size) for size in header.get_shape())
            if key in weights:
                stored.shapes[weights[key]] = shape
            bits = "".join(character for character in header.get_dtype().split("_")[0] if character.isdigit())
            stored.nbytes += math.prod(shape) * max(1, int(bits or 8) // 8)  # "F32": 4, "BF16": 2, "BOOL": 1
    return stored


def build_checked(
    recipe: Recipe, stored: StoredTensors, *, trust_remote_code: bool, file: Path, where: str
) -> nn.Module:
    """The model ``recipe`` describes, built only when its names are allowed and its sizes fit ``stored``.

    Args:
        recipe: Architecture and config, and whether the caller gave them.
        stored: The shapes of the weights in the file.
        trust_remote_code: Whether import paths from the file may be imported.
        file: The checkpoint (for messages).
        where: ``the weights in 'q.safetensors' under 'trending__'`` (for messages).

    Returns:
        The model, built for real (weights not yet loaded).

    Raises:
        CheckpointError: A name that is not allowed (nothing is imported), a config the class
            rejects, a model larger than the file's tensors, or state-dict shapes that differ from them.
    """
    allow_import = trust_remote_code or recipe.architecture_from_caller
    allow_in_config = trust_remote_code or recipe.config_from_caller
    with _refused(recipe, file):
        try:  # the class is imported (if allowed) before the meta build, so its module keeps real tensors
            resolve_model_class(recipe.architecture, allow_import=allow_import)
        except UnregisteredModelError:
            raise
        except ValueError as error:
            raise CheckpointError(f"cannot rebuild the model of {str(file)!r}: {error}") from error

    def build() -> nn.Module:
        return build_model(
            recipe.architecture, dict(recipe.config), allow_import=allow_import, allow_import_in_config=allow_in_config
        )

    try:
        with _refused(recipe, file), _budget(stored, recipe, file), torch.device("meta"):
            measured: _Measured | None = _Measured.of(build())
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001 - a constructor that reads tensor values cannot run on meta: built for real below
        measured = None
    if measured is not None:
        measured.check(stored, recipe, file, where)
    try:
        with _refused(recipe, file), _budget(stored, recipe, file):
            model = build()
    except CheckpointError:
        raise
    except Exception as error:  # the class rejects the config (ValueError), or torch does (sizes it cannot make)
        called = isinstance(error.__cause__ or error, TypeError)  # the arguments it was called with (build_model's)
        fix = "; give its arguments: diag's --model-kwargs JSON, load_checkpoint's config=" if called else ""
        raise CheckpointError(f"cannot rebuild the model of {str(file)!r}: {_first_line(error)}{fix}") from error
    if measured is None:
        _Measured.of(model).check(stored, recipe, file, where)
    return model


# --------------------------------------------------------------------------------------------------------------- names


@contextmanager
def _refused(recipe: Recipe, file: Path) -> Iterator[None]:
    """A refused import path as the reader says it: which name, where from, and the two ways to allow it."""
    try:
        yield
    except UnregisteredModelError as error:
        raise CheckpointError(_refusal(recipe, error.name, file)) from None


def _refusal(recipe: Recipe, name: str, file: Path) -> str:
    run = (
        f"which is not a registered architecture; lightning-ig does not import a module a file names (importing "
        f"{shown(name.partition(':')[0])} would run its code)"
    )
    trust = "pass --trust-remote-code (trust_remote_code=True)"
    if name == recipe.architecture and name.startswith("__main__:"):  # saved by a script: no other process has it
        return (
            f"{str(file)!r} names the architecture {shown(name)}: the model's class was defined in a script run as "
            f"__main__ (or a notebook), which only that process loads (architecture={name!r}); elsewhere, define the "
            "class in a module, import it from there and save the model again, or name that module's class with "
            f"--model module:{name[9:]} (architecture=...)"
        )
    if name == recipe.architecture:
        return (
            f"{str(file)!r} names the architecture {shown(name)}, {run}. If you trust the file and that "
            f"module, name the class yourself with --model {name} (architecture={name!r}) or {trust}"
        )
    return (
        f"the config of {str(file)!r} (architecture {shown(recipe.architecture)}) names the architecture "
        f"{shown(name)} inside it, {run}. If you trust the file and that module, "
        f"{trust}, or give the config yourself with --model-kwargs JSON (config=)"
    )


# --------------------------------------------------------------------------------------------------------------- sizes


class _TooLarge(Exception):
    """Raised from inside a constructor by the registration hook: the build makes more than the file holds."""


@dataclass
class _Counts:
    max_tensors: int
    max_numel: int
    tensors: int = 0
    real_numel: int = 0  # memory actually taken (tensors not on the meta device)


_ACTIVE: contextvars.ContextVar[_Counts | None] = contextvars.ContextVar("lightning_ig_build_budget", default=None)


@contextmanager
def _budget(stored: StoredTensors, recipe: Recipe, file: Path) -> Iterator[None]:
    """Count the parameters and buffers registered in this thread while a build runs; stop one that overspends."""
    from torch.nn.modules import module as torch_module  # noqa: PLC0415

    max_tensors, max_numel = stored.limits()
    counts = _Counts(max_tensors, max_numel)

    def hook(module: nn.Module, name: str, tensor: Tensor | None) -> None:
        if tensor is None or _ACTIVE.get() is not counts:  # another thread's build, or none
            return
        counts.tensors += 1
        if tensor.device.type != "meta" and not is_lazy(tensor):  # a lazy one takes its shape from the file
            counts.real_numel += tensor.numel()
        if counts.tensors > counts.max_tensors or counts.real_numel > counts.max_numel:
            raise _TooLarge

    token = _ACTIVE.set(counts)
    handles = [
        torch_module.register_module_parameter_registration_hook(hook),
        torch_module.register_module_buffer_registration_hook(hook),
    ]
    try:
        yield
    except _TooLarge:
        made = f"{counts.tensors:,} tensors" + (f" holding {counts.real_numel:,} values" if counts.real_numel else "")
        raise CheckpointError(
            f"the config of {str(file)!r} describes a model far larger than the weights stored in it: building "
            f"{recipe.described} made {made} before it was stopped; the file stores {stored.count:,} tensors of "
            f"{stored.numel:,} values; fix the config (--model-kwargs JSON, config=) or use the checkpoint it "
            "belongs to"
        ) from None
    finally:
        for handle in handles:
            handle.remove()
        _ACTIVE.reset(token)


@dataclass
class _Measured:
    """What a built model holds: its parameters and buffers, and its state dict's shapes."""

    numel: int
    size: int  # bytes
    tensors: int
    state_shapes: dict[str, tuple[int, ...] | None]  # None: a lazy tensor, shaped by the file when loaded

    @classmethod
    def of(cls, model: nn.Module) -> _Measured:
        unique = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}  # tied: once
        tensors = [tensor for tensor in unique.values() if not is_lazy(tensor)]
        return cls(
            numel=sum(tensor.numel() for tensor in tensors),
            size=sum(tensor.numel() * tensor.element_size() for tensor in tensors),
            tensors=len(tensors),
            state_shapes=state_shapes(model),
        )

    def check(self, stored: StoredTensors, recipe: Recipe, file: Path, where: str) -> None:
        """Refuse a model larger than ``stored`` allows, or whose state-dict shapes are not the file's."""
        max_tensors, max_numel = stored.limits()
        if self.numel > max_numel or self.tensors > max_tensors:
            raise CheckpointError(
                f"the config of {str(file)!r} describes a model larger than the weights stored in it: "
                f"{recipe.described} has {self.numel:,} parameter and buffer values ({size_text(self.size)}) in "
                f"{self.tensors:,} tensors, the file stores {stored.numel:,} values in {stored.count:,} tensors; "
                "refused before allocating it: fix the config (--model-kwargs JSON, config=) or use the checkpoint "
                "it belongs to"
            )
        mismatch = shape_mismatch(self.state_shapes, stored.shapes, stored.prefix)
        if mismatch is not None:  # the words load_state_dict's errors use
            raise CheckpointError(
                f"{where} do not fit {recipe.described} ({mismatch}); check --model/--model-kwargs or the head"
            )


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...] | None]:
    """The shapes of ``model``'s state dict, ``None`` for a lazy tensor (shaped by the weights it is given)."""
    return {key: None if is_lazy(value) else tuple(value.shape) for key, value in model.state_dict().items()}


def shape_mismatch(
    expected: Mapping[str, tuple[int, ...] | None], held: Mapping[str, tuple[int, ...]], prefix: str = ""
) -> str | None:
    """Why weights of the ``held`` shapes (read under ``prefix``) do not load into a model whose state dict has the
    ``expected`` ones (``None``: a lazy tensor, any shape), in load_state_dict's words; ``None`` where they do."""
    if wrong := [key for key, shape in expected.items() if shape is not None and held.get(key, shape) != shape]:
        key = wrong[0]
        found = f"the file holds {held[key]}, the model has {expected[key]}"
        return f"size mismatch for {key}: {found}; {len(wrong)} tensor(s) differ"
    missing, unexpected = [key for key in expected if key not in held], [key for key in held if key not in expected]
    stem = next((key[: -len(missing[0])] for key in unexpected if missing and key.endswith("." + missing[0])), "")
    moved = {stem + key for key in missing} == {*unexpected}  # every key under one prefix: a wrapper's state dict
    hint = f"; each key is the model's under {stem}: pass --prefix {prefix}{stem} (prefix=)" if moved else ""
    return f"missing {few(missing)}, unexpected {few(unexpected)}{hint}" if missing or unexpected else None


def _first_line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if not isinstance(error, ValueError) else text
