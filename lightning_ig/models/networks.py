"""The Q-networks the examples and the command line use: dueling MLPs and CNNs, with optional NoisyNet streams.

Each is registered (:func:`~lightning_ig.models.registry.register_model`) under its class name, and its
``config()`` returns its constructor's keyword arguments, so a checkpoint rebuilds it without the user's code.
Constructors check their arguments (sizes up to ``2**31 - 1``): a checkpoint's config is data.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.attribution.checks import check_generator
from lightning_ig.models.noise import NoisyLinear
from lightning_ig.models.noisy_linear import check_sigma0
from lightning_ig.models.registry import register_model
from lightning_ig.vocabulary import check_choice, shown

__all__ = ["ACTIVATIONS", "Activation", "ConvDuelingQNetwork", "DuelingQNetwork", "MinAtarQNetwork", "NatureQNetwork"]

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


@register_model("DuelingQNetwork")
class DuelingQNetwork(nn.Module):
    """A dueling Q-network (Wang et al., 2016) with optional NoisyNet streams.

    An MLP body ``state -> features``, then a value stream ``V(s)`` (one output) and an advantage stream ``A(s, a)``
    (one per action), combined as ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``. So the mean of the Q-values over
    actions is ``V(s)``: a smooth scalar target for attribution, free of the argmax's discontinuities. With
    ``noisy=True`` the streams use :class:`~lightning_ig.models.noise.NoisyLinear` (NoisyNet exploration); the body is
    always deterministic.

    Args:
        state_dim: Number of input features, ``>= 1``.
        num_actions: Number of actions, ``>= 1``.
        hidden_sizes: Widths of the body's hidden layers, each ``>= 1``; default
            ``(256, 256)``. Empty means the streams read the state directly.
        noisy: Whether the streams are NoisyLinear layers. Default ``True``.
        sigma0: NoisyLinear's initial noise scale. Default ``0.5``.
        activation: ``"relu"`` (default), or a smooth ``"tanh"``, ``"softplus"``, ``"silu"`` or ``"gelu"``.
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
        >>> from lightning_ig.models import build_model, model_name
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
        state_dim, num_actions = _check_size("state_dim", state_dim), _check_size("num_actions", num_actions)
        self.hidden_sizes = _check_sizes("hidden_sizes", hidden_sizes)
        if stream_hidden_size is not None:
            stream_hidden_size = _check_size("stream_hidden_size", stream_hidden_size)
        if not isinstance(noisy, bool):
            raise TypeError(f"noisy must be a bool, got {type(noisy).__name__} ({noisy!r})")
        check_choice(activation, tuple(ACTIVATIONS), "activation")
        self.state_dim, self.num_actions, self.noisy = state_dim, num_actions, noisy
        self.sigma0 = check_sigma0(sigma0)
        self.activation, self.stream_hidden_size = activation, stream_hidden_size

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


def _check_size(name: str, value: Any) -> int:
    """``value`` as an int in ``[1, 2**31 - 1]``; numpy's ints too (Gymnasium's ``action_space.n`` is one)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({shown(value)})")
    if (size := int(value)) < 1:
        raise ValueError(f"{name} must be >= 1, got {shown(value)}")
    if size > _MAX_SIZE:
        raise ValueError(f"{name} must be <= 2**31 - 1, got {shown(value)}; check the model's sizes")
    return size


@register_model("ConvDuelingQNetwork")
class ConvDuelingQNetwork(nn.Module):
    """A convolutional dueling Q-network with NoisyNet streams, for channels-first frames ``(C, H, W)``.

    Convolutions (no padding, each followed by the activation) turn a frame into a flat vector that a
    :class:`DuelingQNetwork` head reads, so the mean of the Q-values over actions is ``V(s)``, the target lightning-ig
    attributes by default. :class:`MinAtarQNetwork` and :class:`NatureQNetwork` are its two usual shapes.

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
        >>> from lightning_ig.models import build_model, model_name
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
        """Q-values: ``(N, C, H, W) -> (N, num_actions)``; one frame ``(C, H, W) -> (num_actions,)`` as in Conv2d."""
        one = x.dim() == len(self.input_shape)
        q = self.head(self.encoder(x.unsqueeze(0) if one else x))
        return q.squeeze(0) if one else q

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

    16 filters 3x3 (stride 1) and a hidden layer of ``hidden_size`` units, then value and advantage streams of one layer
    each (NoisyLinear when ``noisy``). ``in_channels``: Breakout 4, Asterix 4, Freeway 7, Seaquest 10, Space Invaders 6.

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
        in_channels = _check_size("in_channels", in_channels)  # named here: the parent would say input_shape[0]
        hidden_size = _check_size("hidden_size", hidden_size)
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
        in_channels = _check_size("in_channels", in_channels)  # named here: the parent would say input_shape[0]
        convs = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
        super().__init__((in_channels, 84, 84), num_actions, convs, (), noisy, sigma0, activation, 512)

    def config(self) -> dict[str, Any]:
        return self._preset_config()


def _check_sizes(name: str, value: Any, length: int | None = None) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {value!r}")
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must have {length} entries, got {value!r}")
    return tuple(_check_size(f"{name}[{index}]", size) for index, size in enumerate(value))
