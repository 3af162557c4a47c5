"""The fit's working copy of the model, where the trust checks compute: the model itself is only ever read.

:class:`Replica` is made once per fit and follows the model (:meth:`Replica.sync`: parameters and buffers copied in
place, plain attributes shared again), so its forward is the model's as attribution sees it without the model being
put into that mode and back. The sanity check's copies re-draw its parameters in place (:meth:`Replica.redraw`), the
stability check's draws are written into its noise buffers (:meth:`Replica.noise`); both attribute with its own engine,
which on a CUDA device captures its IG once and replays it. That IG runs with the NoisyLinear layers' noise on and
``epsilon = 0`` between draws: the mean weights, on the one code path a graph holds. Other libraries' noisy layers are
off for good. Why and what it costs: ``docs/trust.md`` (the trust checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.models.noise import NoisyLinear, is_noisy_layer, noise_disabled
from lightning_ig.trust.common import AttributionSettings, shared_attributes, structure_copy

__all__ = ["Replica", "redraw"]


class Replica:
    """A working copy of ``model`` that follows its weights, with its own IG engine.

    Args:
        model: the model (never written).
        settings: how the run attributes (the engine's forward, target and options).

    Attributes:
        module: the copy.
        noisy: its :class:`~lightning_ig.models.NoisyLinear` layers.
        settings: what it was made with.
        forward: the run's forward on the copy (``x -> output``).
        engine: its :class:`~lightning_ig.attribution.IntegratedGradients`.
    """

    def __init__(self, model: nn.Module, settings: AttributionSettings) -> None:
        self.model = model
        self._source: nn.Module | None = None  # where sync() copies from, when not the model (following)
        self.module = structure_copy(model).eval()
        self.noisy = [layer for layer in self.module.modules() if isinstance(layer, NoisyLinear)]
        for layer in self.noisy:
            layer.disable_noise()  # on only for IG (noise_on): a plain forward computes with the mean weights
            layer.training = True  # these layers alone: dropout and batch-norm stay in eval mode
        self._switched = contextlib.ExitStack()  # other libraries' noisy layers, off for the copy's life
        self._switch_foreign_noise_off()
        self._epsilons = [
            buffer
            for layer in self.noisy
            for buffer in (layer.weight_epsilon, layer.bias_epsilon)
            if buffer is not None
        ]
        self._names = _followed_names(self.module)
        self._mine = self._tensors()
        # sync() shares them again (training may set a float anew); noisy layers' are the copy's own (noise switch)
        self._shared = [entry for entry in shared_attributes(model, self.module) if not is_noisy_layer(entry[1])]
        self.quiet()
        self.settings = settings
        self.forward = settings.call(self.module)
        # no NaN/Inf check of the inputs: they are the run's states, checked when they were set up
        self.engine = IntegratedGradients(self.forward, target=settings.target, **settings.options.keywords())
        self._draws: dict[tuple[int, int], list[list[Tensor]]] = {}

    def sync(self) -> None:
        """Copy the model's parameters and buffers (but noise samples) into the copy, in place, and share its plain
        attributes again (inside :meth:`following`, another copy's parameters and buffers only). A tensor renamed or
        resized since the copy was made (pruning renames ``weight`` ``weight_orig``) raises KeyError or RuntimeError."""
        source = self.model if self._source is None else self._source  # a Module with __len__ 0 is falsy
        for followed, copied, name in self._shared if self._source is None else ():
            vars(copied)[name] = vars(followed).get(name, vars(copied).get(name))
        theirs = dict([*source.named_parameters(remove_duplicate=False), *source.named_buffers(remove_duplicate=False)])
        with torch.inference_mode(False), torch.no_grad():
            for mine, name in zip(self._mine, self._names):
                mine.copy_(theirs[name])

    @contextlib.contextmanager
    def following(self, source: nn.Module | None) -> Iterator[None]:
        """:meth:`sync` copies from ``source`` inside the block: another copy of the model that holds the weights of
        an earlier step (a run attributed beside training, checked later); ``None``: the model."""
        self._source = source
        try:
            yield
        finally:
            self._source = None

    def packed(self) -> bytes:
        """The copy's parameters and buffers that :meth:`sync` writes, their bytes in its order (what :meth:`unpack`
        reads; one buffer pickles ~15x faster than the tensors do)."""
        return b"".join(tensor.detach().reshape(-1).view(torch.uint8).numpy().tobytes() for tensor in self._mine)

    def unpack(self, packed: bytes) -> None:
        """Write another copy's :meth:`packed` (as synced there) into the copy, in place."""
        data = torch.frombuffer(bytearray(packed), dtype=torch.uint8) if packed else torch.empty(0, dtype=torch.uint8)
        offset = 0
        with torch.inference_mode(False), torch.no_grad():
            for mine in self._mine:
                size = mine.numel() * mine.element_size()
                chunk = data[offset : offset + size]  # a view of dtype needs its alignment: after a bool, a copy
                chunk = chunk if offset % mine.element_size() == 0 else chunk.clone()
                mine.copy_(chunk.view(mine.dtype).reshape(mine.shape))
                offset += size
        if offset != len(data):
            raise ValueError(f"Replica.unpack: {len(data)} bytes for a copy of {offset}")

    def quiet(self) -> None:
        """Noise samples to zero: the NoisyLinear layers compute with their mean weights."""
        if self._epsilons:
            with torch.inference_mode(False), torch.no_grad():
                for epsilon in self._epsilons:
                    epsilon.zero_()

    def noise(self, seed: int, draw: int, count: int) -> None:
        """Write noise draw ``draw`` of ``count`` into the NoisyLinear layers: each layer's
        :meth:`~lightning_ig.models.NoisyLinear.reset_noise` from private generators seeded ``seed`` (one per device),
        drawn in turn for the ``count`` draws, once per fit, and kept (the same draws at every check)."""
        if (draws := self._draws.get((seed, count))) is None:
            draws = self._draws[(seed, count)] = self._make_draws(seed, count)
        with torch.inference_mode(False), torch.no_grad():
            for epsilon, drawn in zip(self._epsilons, draws[draw]):
                epsilon.copy_(drawn)

    def redraw(self, seed: int) -> tuple[int, int]:
        """Draw every parameter again under ``seed`` (:func:`redraw`): ``(shuffled, kept)``. :meth:`sync` undoes it."""
        for _, copied, name in self._shared:  # a weight a hook derives (pruning's, spectral_norm's): an init writes it
            if _derived(copied, name) and hasattr(copied, "reset_parameters"):
                vars(copied)[name] = vars(copied)[name].clone()  # the copy's own, never the model's
        counts, tensors = redraw(self.module, seed), self._tensors()
        if any(mine is not now for mine, now in zip(self._mine, tensors)):  # a reset_parameters() made new tensors
            self._mine = tensors
            self.engine.clear()  # a captured graph reads the old ones
        self._switched.close()
        self._switch_foreign_noise_off()  # an initialisation may have drawn their noise
        self.quiet()
        return counts

    def attribute(self, states: Tensor, baselines: Tensor | None) -> Tensor:
        """IG of the copy as it is now: ``(N, *feature_shape)`` attributions (``baselines=None``: zeros)."""
        with self.noise_on(), stochastic_warnings_silenced():  # deterministic between draws
            return self.engine.attribute(states, baselines=baselines).attributions

    @contextlib.contextmanager
    def noise_on(self) -> Iterator[nn.Module]:
        """The NoisyLinear layers compute ``mu + sigma * epsilon`` inside the block (the code path a graph of the
        copy's IG holds; the epsilon is whatever :meth:`noise` or :meth:`quiet` wrote)."""
        for layer in self.noisy:
            layer.enable_noise()
        try:
            yield self.module
        finally:
            for layer in self.noisy:
                layer.disable_noise()

    def _tensors(self) -> list[Tensor]:
        mine = {**dict(self.module.named_parameters()), **dict(self.module.named_buffers())}
        return [mine[name] for name in self._names]

    def _switch_foreign_noise_off(self) -> None:
        for layer in self.module.modules():
            if is_noisy_layer(layer) and not isinstance(layer, NoisyLinear):
                self._switched.enter_context(noise_disabled(layer))

    def _make_draws(self, seed: int, count: int) -> list[list[Tensor]]:
        generators: dict[torch.device, torch.Generator] = {}
        draws = []
        with torch.inference_mode(False), torch.no_grad():
            for _ in range(count):
                for layer in self.noisy:
                    device = layer.weight_mu.device
                    if device not in generators:
                        generators[device] = torch.Generator(device=device).manual_seed(seed)
                    layer.reset_noise(generator=generators[device])
                draws.append([buffer.clone() for buffer in self._epsilons])
        self.quiet()
        return draws


def redraw(module: nn.Module, seed: int) -> tuple[int, int]:
    """Draw every parameter of ``module`` again under ``seed``, in place: ``(shuffled, kept)``.

    Every module with ``reset_parameters()`` calls it (the layer's own initialisation) with torch's global generators
    seeded ``seed`` inside :func:`torch.random.fork_rng`, so the training run's generators are as they were; the
    parameters of modules without one, or whose weight a hook derives (pruning's), are shuffled by a seeded
    permutation of their entries (same scale, no structure: ``shuffled`` counts them); single numbers are kept.
    """
    devices = sorted({tensor.device.index or 0 for tensor in module.parameters() if tensor.device.type == "cuda"})
    covered: set[int] = set()
    with torch.random.fork_rng(devices=devices, device_type="cuda"), torch.inference_mode(False), torch.no_grad():
        torch.random.default_generator.manual_seed(seed)
        for device in devices:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)  # this device's generator (fork_rng puts it back)
        for layer in module.modules():
            if callable(reset := getattr(layer, "reset_parameters", None)):
                reset()  # the layer's own initialisation, on the seeded global generator
                if not any(_derived(layer, name) for name in vars(layer)):  # else it drew a hook's weight
                    covered.update(id(parameter) for parameter in layer.parameters(recurse=False))
    shuffled = kept = 0
    generator = torch.Generator().manual_seed(seed)  # private, CPU: the same shuffle on every device
    with torch.inference_mode(False), torch.no_grad():
        for parameter in module.parameters():
            if id(parameter) in covered:
                continue
            if parameter.numel() < 2:
                kept += 1
                continue
            order = torch.randperm(parameter.numel(), generator=generator).to(parameter.device)
            parameter.copy_(parameter.reshape(-1)[order].reshape(parameter.shape))
            shuffled += 1
    return shuffled, kept


def _derived(layer: nn.Module, name: str) -> bool:
    """Whether ``layer.name`` is a plain tensor a hook computes from parameters named after it (``weight_orig``)."""
    own = (parameter for parameter, _ in layer.named_parameters(recurse=False))
    return isinstance(vars(layer).get(name), Tensor) and any(parameter.startswith(f"{name}_") for parameter in own)


def _followed_names(module: nn.Module) -> Sequence[str]:
    """The parameters and buffers :meth:`Replica.sync` copies: all but noisy layers' buffers (noise samples)."""
    skipped = {
        f"{prefix}.{name}" if prefix else name
        for prefix, layer in module.named_modules()
        if is_noisy_layer(layer)
        for name, buffer in layer.named_buffers(recurse=False)
        if buffer is not None
    }
    names = [name for name, _ in module.named_parameters()]
    return names + [name for name, _ in module.named_buffers() if name not in skipped]
