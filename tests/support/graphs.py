"""CUDA-graph capture emulated on the CPU, passed to IntegratedGradients(graph_capture=...) by the engine's tests.

A "graph" remembers the computation and the tensors it wrote; a replay reruns
the computation and copies its results into those tensors, which is what a
CUDA-graph replay does to its static outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightning_ig.ops.ig import TorchIG


class EmulatedGraph:
    def __init__(self, compute: Callable[[], dict[str, torch.Tensor]], outputs: dict[str, torch.Tensor]) -> None:
        self.compute, self.outputs = compute, outputs
        self.replays = 0

    def replay(self) -> None:
        fresh = self.compute()
        for name, tensor in self.outputs.items():
            tensor.copy_(fresh[name])
        self.replays += 1


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
            outputs = compute()
        finally:
            self.capturing = False
        self.graphs.append(EmulatedGraph(compute, outputs))
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
