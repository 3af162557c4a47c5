"""CUDA-graph capture emulated on the CPU, passed to IntegratedGradients(graph_capture=...) by the engine's tests.

A "graph" remembers the computation and the tensors it wrote; a replay reruns
the computation and copies its results into those tensors, which is what a
CUDA-graph replay does to its static outputs. A real replay runs the kernels the
capture recorded, whatever the modules' Python state is by then (train mode, noise
on): so the emulated replay runs the modules the capture ran in the mode they had
then (``training`` and a NoisyLinear's noise switch), and puts back what it found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightning_ig.ops.ig import TorchIG

_MODE = ("training", "_noise_enabled")  # what decides which kernels a module's forward runs


class EmulatedGraph:
    def __init__(
        self,
        compute: Callable[[], dict[str, torch.Tensor]],
        outputs: dict[str, torch.Tensor],
        modes: dict[torch.nn.Module, dict[str, Any]] | None = None,
    ) -> None:
        self.compute, self.outputs = compute, outputs
        self.modes = modes or {}  # the modules the capture ran, in the mode they had then
        self.replays = 0

    def replay(self) -> None:
        found = {module: {name: vars(module)[name] for name in mode} for module, mode in self.modes.items()}
        try:
            for module, mode in self.modes.items():
                vars(module).update(mode)
            fresh = self.compute()
        finally:
            for module, mode in found.items():
                vars(module).update(mode)
        for name, tensor in self.outputs.items():
            tensor.copy_(fresh[name])
        self.replays += 1


def _modes_while(compute: Callable[[], dict[str, torch.Tensor]]) -> tuple[Any, dict[torch.nn.Module, dict[str, Any]]]:
    """Run ``compute``; also return the modules whose forward it ran, with their mode (as a capture records it)."""
    modes: dict[torch.nn.Module, dict[str, Any]] = {}

    def note(module: torch.nn.Module, args: Any) -> None:
        modes.setdefault(module, {name: vars(module)[name] for name in _MODE if name in vars(module)})

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    try:
        return compute(), modes
    finally:
        handle.remove()


class EmulatedCapture:
    """Captures on any device: a warm-up, then the computation whose outputs become the graph's."""

    def __init__(self) -> None:
        self.graphs: list[EmulatedGraph] = []
        self.attempts = 0
        self.capturing = False

    def available(self, device: torch.device) -> bool:
        return True

    def capture(
        self, compute: Callable[[], dict[str, torch.Tensor]], device: torch.device
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        self.attempts += 1
        self.capturing = True
        try:
            compute()  # the warm-up
            outputs, modes = _modes_while(compute)
        finally:
            self.capturing = False
        self.graphs.append(EmulatedGraph(compute, outputs, modes))
        return self.graphs[-1], outputs


class FailingCapture(EmulatedCapture):
    """Every capture fails, as one does for a forward that synchronises with the host."""

    def capture(
        self, compute: Callable[[], dict[str, torch.Tensor]], device: torch.device
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        self.attempts += 1
        raise RuntimeError("operation not permitted when stream is capturing")


class KernelsThatCannotBeCaptured(TorchIG):
    """Stands in for the CUDA kernels on a set-up where their launches fail inside a capture; twins: torch's."""

    name = "cuda"

    def __init__(self, capture: EmulatedCapture) -> None:
        self.capture = capture
        self.twin = TorchIG()

    def interpolate(self, x: torch.Tensor, b: torch.Tensor, alphas: torch.Tensor, end_copies: int) -> torch.Tensor:
        if self.capture.capturing:  # as a CuPy launch would fail inside a capture on a broken set-up
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return super().interpolate(x, b, alphas, end_copies)
