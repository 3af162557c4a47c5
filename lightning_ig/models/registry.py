"""The registry that names architectures in checkpoints: register a class, build one from its name and config.

A checkpoint records the architecture's *name* (one registered here with :func:`register_model`, or an import path
``"package.module:Class"``) and its *config* (the constructor's keyword arguments as JSON), so that
``lightning-ig diag`` rebuilds the model without the user's code. Importing a module runs its code, so an import path is
followed only on the caller's say-so: given ``allow_import=False``, :func:`resolve_model_class` and :func:`build_model`
refuse it with :class:`UnregisteredModelError` before anything is imported, and so does every name a class meets while
it builds itself from that config.
"""

from __future__ import annotations

import importlib
import keyword
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import torch
from torch import nn

from lightning_ig.vocabulary import shown

__all__ = [
    "UnregisteredModelError",
    "build_model",
    "model_config",
    "model_name",
    "register_model",
    "resolve_model_class",
]

_REGISTRY: dict[str, type[nn.Module]] = {}
_ModelT = TypeVar("_ModelT", bound=type[nn.Module])
# Whether an import path may be followed by the build in progress: False while a class builds itself from a
# config whose names the caller did not vouch for (a checkpoint's), so nothing under that config can widen it.
_IMPORTS_ALLOWED: ContextVar[bool] = ContextVar("lightning_ig_model_imports_allowed", default=True)


class UnregisteredModelError(ValueError):
    """An architecture name that is an import path, not registered, met where imports are not allowed.

    Raised before anything is imported. ``name`` is the import path refused.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        module = name.partition(":")[0]
        super().__init__(
            f"model {shown(name)} is not registered, and importing it would run the code of module "
            f"{shown(module)}; register the class (lightning_ig.models.register_model) or allow the import "
            "(allow_import=True) if you trust that module"
        )


def register_model(name: str) -> Callable[[_ModelT], _ModelT]:
    """Class decorator: register an architecture under ``name`` for checkpoints.

    The class's constructor must accept the dict its instances return from ``config()`` as keyword arguments.

    A registered class is built from whatever config a file holds, without the reader's opt-in: register classes whose
    constructors check their arguments, and do not read tensor values there (a reader builds the model on the ``meta``
    device first to count its size; one that reads values is built for real, under a bound).

    Args:
        name: The name written into checkpoints. Must not contain ``":"`` (reserved for import paths).

    Returns:
        The decorator, which returns the class unchanged.

    Raises:
        ValueError: If ``name`` is blank, starts or ends with a space, contains ``":"``, or is already taken by another
            class (another import path: a class reloaded from its module keeps its name).

    Example::

        >>> @register_model("TinyMLP")
        ... class TinyMLP(torch.nn.Module):
        ...     def __init__(self, width: int = 4):
        ...         super().__init__()
        ...         self.width = width
        ...         self.layer = torch.nn.Linear(width, 1)
        ...     def config(self):
        ...         return {"width": self.width}
        >>> build_model("TinyMLP", {"width": 3}).layer.in_features
        3
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip() or ":" in name:
        raise ValueError(f"model name must be a non-blank string without ':' or edge spaces, got {name!r}")

    def decorator(cls: _ModelT) -> _ModelT:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_model({name!r}) decorates torch.nn.Module subclasses, got {cls!r}")
        if (taken := _REGISTRY.get(name)) is not None and _import_path(taken) != _import_path(cls):
            raise ValueError(f"model name {name!r} is already registered for {_import_path(taken)}; pick another name")
        _REGISTRY[name] = cls
        return cls

    return decorator


def _import_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_model_class(name: str, *, allow_import: bool = True) -> type[nn.Module]:
    """The class for a registered name or an import path ``"package.module:Class"``.

    The name's form and the registry are checked before anything is imported.

    Args:
        name: A registered name, or ``"package.module:Class"`` (``Class`` may be dotted for a nested class).
        allow_import: Whether an import path may be imported (which runs that module's code). Default ``True``: a name
            in the caller's own code is the caller's choice. Pass ``False`` for names read from a file; inside
            :func:`build_model` with imports refused for its config, ``True`` cannot widen that.

    Returns:
        The ``torch.nn.Module`` subclass.

    Raises:
        UnregisteredModelError: If ``name`` is an unregistered import path and imports are not allowed.
        ValueError: If the name is neither registered nor an import path, is not importable, or does not name a Module
            class.
        TypeError: If ``allow_import`` is not a bool.
    """
    _check_flag("allow_import", allow_import)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a model name must be a non-empty string, got {shown(name)}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(
            f"unknown model {shown(name)}: registered models are {known}; name your own class as 'package.module:Class'"
        )
    module_name, _, attribute = name.partition(":")
    if not (_dotted_identifier(module_name) and _dotted_identifier(attribute)):
        raise ValueError(
            f"model {shown(name)} is not an import path 'package.module:Class' (dotted Python names on both "
            "sides of one ':'); check the name"
        )
    if not (allow_import and _IMPORTS_ALLOWED.get()):
        raise UnregisteredModelError(name)
    try:
        module = _import(module_name)
    except Exception as error:  # ImportError, or an error while the user's module runs
        raise ValueError(
            f"cannot import module {module_name!r} for model {name!r} ({type(error).__name__}: {error}); "
            "check the import path and that the package is on PYTHONPATH"
        ) from error
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}; check the class name in {name!r}")
        value = getattr(value, part)
    if not (isinstance(value, type) and issubclass(value, nn.Module)):
        raise ValueError(f"{name!r} is not a torch.nn.Module subclass (got {value!r}); name a model class")
    return value


def build_model(
    name: str,
    config: dict[str, Any] | None = None,
    *,
    allow_import: bool = True,
    allow_import_in_config: bool | None = None,
) -> nn.Module:
    """Build a model from its registered name (or import path) and config.

    Args:
        name: A registered name or ``"package.module:Class"``.
        config: The constructor's keyword arguments; default ``None`` means none.
        allow_import: Whether ``name`` may be an import path, imported if so (see :func:`resolve_model_class`). Default
            ``True``: the caller wrote the name.
        allow_import_in_config: Whether the names the class meets while it builds itself from ``config`` may be import
            paths. Default ``None``: as ``allow_import``. ``False`` when ``config`` comes from a file while ``name`` is
            the caller's.

    Returns:
        The new model (in training mode, freshly initialised).

    Raises:
        UnregisteredModelError: If ``name``, or a name inside ``config``, is an unregistered import path where imports
            are not allowed; nothing is imported then.
        ValueError: If the name cannot be resolved or the constructor rejects the config.
        TypeError: If ``config`` is not a dict, or a flag is not a bool.

    Example::

        >>> build_model("DuelingQNetwork", {"state_dim": 4, "num_actions": 2}, allow_import=False).num_actions
        2
        >>> linear = {"in_features": 2, "out_features": 1}
        >>> build_model("torch.nn:Linear", linear, allow_import=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_ig.models.registry.UnregisteredModelError: model 'torch.nn:Linear' is not registered, ...
    """
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict of keyword arguments, got {type(config).__name__}")
    if allow_import_in_config is not None:
        _check_flag("allow_import_in_config", allow_import_in_config)
    cls = resolve_model_class(name, allow_import=allow_import)
    inner = allow_import if allow_import_in_config is None else allow_import_in_config
    token = _IMPORTS_ALLOWED.set(_IMPORTS_ALLOWED.get() and inner)
    try:
        return cls(**config)
    except UnregisteredModelError:
        raise  # a refused name inside the config: said as it is, not as a config the class rejects
    except (TypeError, ValueError) as error:
        raise ValueError(f"cannot build model {name!r} with config {shown(config)}: {error}") from error
    finally:
        _IMPORTS_ALLOWED.reset(token)


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({shown(value)})")


def _dotted_identifier(text: str) -> bool:
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in text.split("."))


def _import(module_name: str) -> Any:
    """``importlib.import_module``, on the real default device even inside ``with torch.device("meta")``. A checkpoint
    reader builds models on the meta device first to count their sizes; a module imported then must not keep meta
    tensors made at import time."""
    if torch.empty(0).device.type == "meta":  # torch.get_default_device() says "cpu" there up to torch 2.6
        with torch.device("cpu"):
            return importlib.import_module(module_name)
    return importlib.import_module(module_name)


def model_name(model: nn.Module) -> str:
    """The name a checkpoint records for ``model``'s architecture.

    The registered name when the class (exactly) is registered, else its import path ``"package.module:Class"``.

    Args:
        model: The model.

    Returns:
        The name, which :func:`build_model` resolves back to the class.
    """
    cls = type(model)
    return next((name for name, registered in _REGISTRY.items() if registered is cls), _import_path(cls))


def model_config(model: nn.Module) -> dict[str, Any] | None:
    """The model's constructor config: ``model.config()`` when it has one, else ``None``."""
    if callable(config := getattr(model, "config", None)):
        value = config()
        if not isinstance(value, dict):
            raise TypeError(f"{type(model).__name__}.config() must return a dict, got {type(value).__name__}")
        return value
    return None
