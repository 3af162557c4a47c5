"""Q-networks for the example and the CLI, and the registry that names architectures in checkpoints.

A checkpoint written by :func:`lightning_ig.checkpoint.save_checkpoint` records the
architecture's *name* and its *config* (the constructor's keyword arguments as
JSON), so that ``lightning-ig diag`` can rebuild the model without the user's
code. A name is either one registered here with :func:`register_model`
(``"DuelingQNetwork"``) or an import path ``"package.module:Class"`` to a class
whose constructor takes the config as keyword arguments.

Importing ``package.module`` runs that module's code, so an import path is only
followed on the caller's say-so. :func:`resolve_model_class` and
:func:`build_model` follow one by default (a name written in the caller's own code
is the caller's choice); given ``allow_import=False`` they accept registered names
only, and refuse any other with :class:`UnregisteredModelError` *before* anything is
imported. The same rule holds for the names a class meets while it builds itself
from ``config`` (an :class:`~lightning_ig.ensemble.Ensemble`'s members): a checkpoint
reader passes ``allow_import=False`` for names that come from the file.
"""

from __future__ import annotations

import importlib
import keyword
import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

from lightning_ig.noise import NoisyLinear
from lightning_ig.vocabulary import check_choice, check_generator, shown

__all__ = [
    "ACTIVATIONS",
    "ConvDuelingQNetwork",
    "DuelingQNetwork",
    "MinAtarQNetwork",
    "NatureQNetwork",
    "UnregisteredModelError",
    "build_model",
    "model_config",
    "model_name",
    "register_model",
    "resolve_model_class",
]

Activation = Literal["relu", "tanh", "softplus", "silu", "gelu"]

#: Activation names -> module factories. ``tanh``, ``softplus``, ``silu`` and ``gelu`` give a
#: smooth network, whose IG completeness converges fast (ReLU kinks slow it down).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "softplus": nn.Softplus,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
}

_REGISTRY: dict[str, type[nn.Module]] = {}
# Registered names whose classes live in modules imported on first use (they import this one).
_REGISTERED_ELSEWHERE = {"Ensemble": "lightning_ig.ensemble"}
ModelT = TypeVar("ModelT", bound=type[nn.Module])
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
            f"{shown(module)}; register the class (lightning_ig.register_model) or allow the import "
            "(allow_import=True) if you trust that module"
        )


def register_model(name: str) -> Callable[[ModelT], ModelT]:
    """Class decorator: register an architecture under ``name`` for checkpoints.

    The class's constructor must accept the dict its instances return from
    ``config()`` as keyword arguments.

    Registering is what lets a checkpoint name the class without the reader's opt-in
    (``trust_remote_code``), so its constructor will be called with whatever config a
    file holds: register classes whose constructors check their arguments. A reader
    builds the model on the ``meta`` device first to count its size, so the
    constructor should not read tensor values (one that does is built for real, under
    a bound, and checked after).

    Args:
        name: The name written into checkpoints. Must not contain ``":"``
            (reserved for import paths).

    Returns:
        The decorator, which returns the class unchanged.

    Raises:
        ValueError: If ``name`` is empty, contains ``":"``, or is already taken by another class.

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
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"model name must be a non-empty string without ':', got {name!r}")

    def decorator(cls: ModelT) -> ModelT:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"register_model({name!r}) decorates torch.nn.Module subclasses, got {cls!r}")
        taken = _REGISTRY.get(name)
        if taken is not None and _import_path(taken) != _import_path(cls):
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
        name: A registered name, or ``"package.module:Class"`` (``Class`` may be
            dotted for a nested class).
        allow_import: Whether an import path may be imported (which runs that
            module's code). Default ``True``: a name in the caller's own code is
            the caller's choice. Pass ``False`` for names read from a file or any
            other source you do not control; inside :func:`build_model` with
            imports refused for its config, ``True`` cannot widen that.

    Returns:
        The ``torch.nn.Module`` subclass.

    Raises:
        UnregisteredModelError: If ``name`` is an unregistered import path and imports are not allowed.
        ValueError: If the name is neither registered nor an import path, is not importable, or does not
            name a Module class.
        TypeError: If ``allow_import`` is not a bool.
    """
    _check_flag("allow_import", allow_import)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a model name must be a non-empty string, got {shown(name)}")
    if name not in _REGISTRY and name in _REGISTERED_ELSEWHERE:
        _import(_REGISTERED_ELSEWHERE[name])  # this package's own module: registers the class
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
        allow_import: Whether ``name`` may be an import path, imported if so (see
            :func:`resolve_model_class`). Default ``True``: the caller wrote the name.
        allow_import_in_config: Whether the names the class meets while it builds
            itself from ``config`` (an ``Ensemble``'s members) may be import paths.
            Default ``None``: as ``allow_import``. ``False`` when ``config`` comes from
            a file while ``name`` is the caller's.

    Returns:
        The new model (in training mode, freshly initialised).

    Raises:
        UnregisteredModelError: If ``name``, or a name inside ``config``, is an unregistered import path
            where imports are not allowed; nothing is imported then.
        ValueError: If the name cannot be resolved or the constructor rejects the config.
        TypeError: If ``config`` is not a dict, or a flag is not a bool.

    Example::

        >>> build_model("DuelingQNetwork", {"state_dim": 4, "num_actions": 2}, allow_import=False).num_actions
        2
        >>> build_model("torch.nn:Linear", {"in_features": 2, "out_features": 1}, allow_import=False)
        Traceback (most recent call last):
        ...
        lightning_ig.models.UnregisteredModelError: model 'torch.nn:Linear' is not registered, ...
    """
    if config is None:
        config = {}
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
    """``importlib.import_module``, on the real default device even inside ``with torch.device("meta")``.

    A checkpoint reader builds models on the meta device first to count their sizes; a
    module imported then must not keep meta tensors made at import time.
    """
    current = getattr(torch, "get_default_device", None)  # torch >= 2.3
    if current is not None and current().type == "meta":
        with torch.device("cpu"):
            return importlib.import_module(module_name)
    return importlib.import_module(module_name)


def model_name(model: nn.Module) -> str:
    """The name a checkpoint records for ``model``'s architecture.

    The registered name when the class (exactly) is registered, else its import
    path ``"package.module:Class"``.

    Args:
        model: The model.

    Returns:
        The name, which :func:`build_model` resolves back to the class.
    """
    cls = type(model)
    for name, registered in _REGISTRY.items():
        if registered is cls:
            return name
    return _import_path(cls)


def model_config(model: nn.Module) -> dict[str, Any] | None:
    """The model's constructor config: ``model.config()`` when it has one, else ``None``."""
    config = getattr(model, "config", None)
    if callable(config):
        value = config()
        if not isinstance(value, dict):
            raise TypeError(f"{type(model).__name__}.config() must return a dict, got {type(value).__name__}")
        return value
    return None


@register_model("DuelingQNetwork")
class DuelingQNetwork(nn.Module):
    """A dueling Q-network (Wang et al., 2016) with optional NoisyNet streams.

    An MLP body ``state -> features``, then a value stream ``V(s)`` (one output)
    and an advantage stream ``A(s, a)`` (one per action), combined as
    ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``. So the mean of the Q-values
    over actions is ``V(s)``: a smooth scalar target for attribution, free of
    the argmax's discontinuities. With ``noisy=True`` the streams use
    :class:`~lightning_ig.noise.NoisyLinear` (NoisyNet exploration); the body is
    always deterministic.

    Args:
        state_dim: Number of input features, ``>= 1``.
        num_actions: Number of actions, ``>= 1``.
        hidden_sizes: Widths of the body's hidden layers, each ``>= 1``; default
            ``(256, 256)``. Empty means the streams read the state directly.
        noisy: Whether the streams are NoisyLinear layers. Default ``True``.
        sigma0: NoisyLinear's initial noise scale. Default ``0.5``.
        activation: ``"relu"`` (default), or a smooth ``"tanh"``, ``"softplus"``,
            ``"silu"`` or ``"gelu"``.
        stream_hidden_size: Width of one hidden layer inside each stream, or
            ``None`` (default) for a single linear layer per stream.

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a size is below 1 or ``activation`` is unknown.

    Example::

        >>> net = DuelingQNetwork(4, 2, hidden_sizes=(32, 32), activation="tanh")
        >>> q = net(torch.zeros(5, 4))
        >>> q.shape
        torch.Size([5, 2])
        >>> build_model(model_name(net), net.config()).config() == net.config()
        True
    """

    def __init__(
        self,
        state_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (256, 256),
        noisy: bool = True,
        sigma0: float = 0.5,
        activation: Activation = "relu",
        stream_hidden_size: int | None = None,
    ) -> None:
        super().__init__()
        _check_size("state_dim", state_dim)
        _check_size("num_actions", num_actions)
        self.hidden_sizes = _check_sizes("hidden_sizes", hidden_sizes)
        if stream_hidden_size is not None:
            _check_size("stream_hidden_size", stream_hidden_size)
        if not isinstance(noisy, bool):
            raise TypeError(f"noisy must be a bool, got {type(noisy).__name__} ({noisy!r})")
        check_choice(activation, tuple(ACTIVATIONS), "activation")
        if isinstance(sigma0, bool) or not isinstance(sigma0, (int, float)) or not math.isfinite(sigma0) or sigma0 < 0:
            raise ValueError(f"sigma0 must be a finite number >= 0, got {sigma0!r}")
        self.state_dim = state_dim
        self.num_actions = num_actions
        self.noisy = noisy
        self.sigma0 = float(sigma0)
        self.activation = activation
        self.stream_hidden_size = stream_hidden_size

        layers: list[nn.Module] = []
        width = state_dim
        for size in self.hidden_sizes:
            layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
            width = size
        self.body = nn.Sequential(*layers)
        self.value = self._stream(width, 1)
        self.advantage = self._stream(width, num_actions)

    def _stream(self, width: int, outputs: int) -> nn.Sequential:
        def linear(n_in: int, n_out: int) -> nn.Module:
            return NoisyLinear(n_in, n_out, sigma0=self.sigma0) if self.noisy else nn.Linear(n_in, n_out)

        if self.stream_hidden_size is None:
            return nn.Sequential(linear(width, outputs))
        hidden = self.stream_hidden_size
        return nn.Sequential(linear(width, hidden), ACTIVATIONS[self.activation](), linear(hidden, outputs))

    def features(self, x: Tensor) -> Tensor:
        """The body's output: ``(..., state_dim) -> (..., hidden_sizes[-1])`` (the state itself if no hidden layer)."""
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        """Q-values: ``(N, state_dim) -> (N, num_actions)`` (any leading dims work)."""
        features = self.features(x)
        value = self.value(features)  # (N, 1)
        advantage = self.advantage(features)  # (N, A)
        return value + advantage - advantage.mean(dim=-1, keepdim=True)

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new noise in every NoisyLinear layer (no-op when ``noisy=False``)."""
        check_generator(generator)  # also when there is no noisy layer to hand it to
        for module in self.modules():
            if isinstance(module, NoisyLinear):
                module.reset_noise(generator)

    def config(self) -> dict[str, Any]:
        """The constructor's arguments, JSON-serialisable: ``DuelingQNetwork(**net.config())`` rebuilds it."""
        return {
            "state_dim": self.state_dim,
            "num_actions": self.num_actions,
            "hidden_sizes": list(self.hidden_sizes),
            "noisy": self.noisy,
            "sigma0": self.sigma0,
            "activation": self.activation,
            "stream_hidden_size": self.stream_hidden_size,
        }


#: The largest layer width, channel count or frame side a model takes: 2**31 - 1, so that the product of two
#: sizes (a weight's element count) stays inside torch's int64 sizes.
_MAX_SIZE = 2**31 - 1


def _check_size(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({shown(value)})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {shown(value)}")
    if value > _MAX_SIZE:
        raise ValueError(f"{name} must be <= 2**31 - 1, got {shown(value)}; check the model's sizes")


@register_model("ConvDuelingQNetwork")
class ConvDuelingQNetwork(nn.Module):
    """A convolutional dueling Q-network with NoisyNet streams, for channels-first frames ``(C, H, W)``.

    Convolutions (no padding, each followed by the activation) turn a frame into
    a flat vector that a :class:`DuelingQNetwork` head reads, so the mean of the
    Q-values over actions is ``V(s)``, the target lightning-ig attributes by
    default. :class:`MinAtarQNetwork` and :class:`NatureQNetwork` are its two usual shapes.

    Args:
        input_shape: ``(channels, height, width)`` of one frame, each ``>= 1``.
        num_actions: Number of actions, ``>= 1``.
        conv_layers: ``(out_channels, kernel_size, stride)`` per convolution; default ``((16, 3, 1),)``.
        hidden_sizes: Widths of the head's deterministic hidden layers; default ``(128,)``.
        noisy, sigma0, activation, stream_hidden_size: As for :class:`DuelingQNetwork`
            (defaults ``True``, ``0.5``, ``"relu"``, ``None``).

    Raises:
        TypeError: If a size is not an int.
        ValueError: If a size is below 1, a convolution does not fit the frame, or ``activation`` is unknown.

    Example::

        >>> net = ConvDuelingQNetwork((4, 10, 10), 3)
        >>> net(torch.zeros(2, 4, 10, 10)).shape
        torch.Size([2, 3])
        >>> build_model(model_name(net), net.config()).config() == net.config()
        True
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_actions: int,
        conv_layers: Sequence[Sequence[int]] = ((16, 3, 1),),
        hidden_sizes: Sequence[int] = (128,),
        noisy: bool = True,
        sigma0: float = 0.5,
        activation: Activation = "relu",
        stream_hidden_size: int | None = None,
    ) -> None:
        super().__init__()
        self.input_shape = _check_sizes("input_shape", input_shape, length=3)
        if isinstance(conv_layers, (str, bytes)) or not isinstance(conv_layers, Sequence):
            raise TypeError(f"conv_layers must be a sequence of (out_channels, kernel, stride), got {conv_layers!r}")
        self.conv_layers = tuple(_check_sizes(f"conv_layers[{i}]", conv, 3) for i, conv in enumerate(conv_layers))
        check_choice(activation, tuple(ACTIVATIONS), "activation")
        channels, height, width = self.input_shape
        layers: list[nn.Module] = []
        for index, (out_channels, kernel_size, stride) in enumerate(self.conv_layers):
            height, width = (height - kernel_size) // stride + 1, (width - kernel_size) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(
                    f"conv_layers[{index}] (kernel {kernel_size}, stride {stride}) does not fit a frame of "
                    f"input_shape {self.input_shape}; use smaller kernels or a larger frame"
                )
            layers += [nn.Conv2d(channels, out_channels, kernel_size, stride), ACTIVATIONS[activation]()]
            channels = out_channels
        self.encoder = nn.Sequential(*layers, nn.Flatten())
        self.head = DuelingQNetwork(
            channels * height * width, num_actions, hidden_sizes, noisy, sigma0, activation, stream_hidden_size
        )

    def features(self, x: Tensor) -> Tensor:
        """What the streams read: ``(N, C, H, W) -> (N, width)`` (an auxiliary head can read it too)."""
        return self.head.features(self.encoder(x))

    def forward(self, x: Tensor) -> Tensor:
        """Q-values: ``(N, C, H, W) -> (N, num_actions)``."""
        return self.head(self.encoder(x))

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new noise in every NoisyLinear layer (no-op when ``noisy=False``)."""
        self.head.reset_noise(generator)

    def config(self) -> dict[str, Any]:
        """The constructor's arguments, JSON-serialisable."""
        head = self.head.config()
        del head["state_dim"]
        return {"input_shape": list(self.input_shape), "conv_layers": [list(conv) for conv in self.conv_layers], **head}

    def _preset_config(self, **extra: Any) -> dict[str, Any]:  # the config of a subclass with fixed convolutions
        head = self.head.config()
        keys = ("num_actions", "noisy", "sigma0", "activation")
        return {"in_channels": self.input_shape[0], **{key: head[key] for key in keys}, **extra}


@register_model("MinAtarQNetwork")
class MinAtarQNetwork(ConvDuelingQNetwork):
    """MinAtar's network (Young & Tian, 2019) as a dueling NoisyNet, for ``(C, 10, 10)`` frames.

    16 filters 3x3 (stride 1) and a hidden layer of ``hidden_size`` units, then
    value and advantage streams of one layer each (NoisyLinear when ``noisy``).
    ``in_channels``: Breakout 4, Asterix 4, Freeway 7, Seaquest 10, Space Invaders 6.

    Example::

        >>> MinAtarQNetwork(in_channels=4, num_actions=3)(torch.zeros(5, 4, 10, 10)).shape
        torch.Size([5, 3])
    """

    def __init__(
        self,
        in_channels: int = 4,
        num_actions: int = 6,
        hidden_size: int = 128,
        noisy: bool = True,
        sigma0: float = 0.5,
        activation: Activation = "relu",
    ) -> None:
        _check_size("in_channels", in_channels)  # named here: the parent would call it input_shape[0]
        _check_size("hidden_size", hidden_size)
        super().__init__((in_channels, 10, 10), num_actions, ((16, 3, 1),), (hidden_size,), noisy, sigma0, activation)

    def config(self) -> dict[str, Any]:
        return self._preset_config(hidden_size=self.head.hidden_sizes[0])


@register_model("NatureQNetwork")
class NatureQNetwork(ConvDuelingQNetwork):
    """The Nature DQN network (Mnih et al., 2015) as a dueling NoisyNet (Wang et al., 2016), for ``(C, 84, 84)`` frames.

    Convolutions 32 8x8/4, 64 4x4/2, 64 3x3/1, then value and advantage streams with a hidden
    layer of 512 units each. Frames are floats: scale uint8 pixels to ``[0, 1]`` first.

    Example::

        >>> NatureQNetwork(num_actions=6)(torch.zeros(2, 4, 84, 84)).shape
        torch.Size([2, 6])
    """

    def __init__(
        self,
        in_channels: int = 4,
        num_actions: int = 18,
        noisy: bool = True,
        sigma0: float = 0.5,
        activation: Activation = "relu",
    ) -> None:
        _check_size("in_channels", in_channels)  # named here: the parent would call it input_shape[0]
        convs = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
        super().__init__((in_channels, 84, 84), num_actions, convs, (), noisy, sigma0, activation, 512)

    def config(self) -> dict[str, Any]:
        return self._preset_config()


def _check_sizes(name: str, value: Any, length: int | None = None) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {value!r}")
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must have {length} entries, got {value!r}")
    for index, size in enumerate(value):
        _check_size(f"{name}[{index}]", size)
    return tuple(int(size) for size in value)
