"""A module that says it was imported: its import writes the file named by ``LIGHTNING_IG_TEST_MARKER``.

tests/checkpoint/test_building.py names it in checkpoints (``tests.support.markermod:Net``) to see, on the disk
and in ``sys.modules``, that a file's architecture is not imported unless the reader trusts it.
"""

import os
import pathlib

import torch

__all__ = ["TABLE", "Net"]

_MARKER = os.environ.get("LIGHTNING_IG_TEST_MARKER")
if _MARKER:
    pathlib.Path(_MARKER).write_text("markermod was imported")
TABLE = torch.arange(3)  # made at import time


class Net(torch.nn.Module):
    """A linear layer, built from ``config`` as a checkpoint's architecture is."""

    def __init__(self, width: int = 4, outputs: int = 2) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)
