"""One collective for a run's result and the rows that ride along with it (a contrast's pairs).

Under DDP every rank makes the same single collective call with the same shape
(:meth:`~lightning_ig.run.host_result.HostResult.begin` calls its ``gather`` once). A run that also needs other
per-state rows gathered (the pairs of ``target="contrast"``) sends them in that same call, beside the result's packed
rows: :class:`JointGather`. In a single process nothing is gathered and the rows stay where they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["JointGather"]


class JointGather:
    """One collective for a run's result and its riders (per-state rows beside the result, e.g. a contrast's pairs).

    Pass it as the ``gather`` of :meth:`HostResult.from_result`: it concatenates the packed result and every rider along
    the columns, makes the one ``gather`` call (every rank the same call with the same shape), and splits the gathered
    rows again. Afterwards :attr:`riders` holds each rider gathered, ``(world * share, W_i)`` in state order, padding
    rows included.

    Args:
        gather: ``trainer.strategy.all_gather``, or ``None`` in a single process (nothing to gather:
            the result and the riders stay as they are).
        riders: ``(share, W_i)`` tensors, one row per state of this rank, on the result's device.
    """

    def __init__(self, gather: Callable[[Tensor], Tensor] | None, riders: list[Tensor]) -> None:
        self._gather = gather
        self.riders = list(riders)

    def __call__(self, packed: Tensor) -> Tensor:
        if self._gather is None:
            return packed
        if not self.riders:
            return self._gather(packed)
        widths = [packed.shape[1], *(rider.shape[1] for rider in self.riders)]
        joint = torch.cat([packed, *(rider.to(packed.dtype) for rider in self.riders)], dim=1)  # (share, sum(widths))
        gathered = self._gather(joint).reshape(-1, joint.shape[1])  # (world * share, sum(widths))
        main, *self.riders = gathered.split(widths, dim=1)
        return main
