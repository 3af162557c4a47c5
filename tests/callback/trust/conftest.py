"""Fixtures of the trust checks' tests: a trained and an untrained NoisyNet MLP on the same states."""

from __future__ import annotations

import pytest
from torch import nn

from tests.support.trust import network


@pytest.fixture(scope="module")
def trained() -> tuple[nn.Module, object]:
    return network(400)


@pytest.fixture(scope="module")
def untrained() -> tuple[nn.Module, object]:
    return network(0)
