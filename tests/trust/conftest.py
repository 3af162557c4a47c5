"""Fixtures of the trust checks' tests: a trained and an untrained NoisyNet MLP on the same states."""

from __future__ import annotations

import pytest
from torch import nn

from tests.support.trust import network


@pytest.fixture(scope="session")  # one fit (~10 s) for every module here; the tests put back what they change
def trained() -> tuple[nn.Module, object]:
    return network(400)


@pytest.fixture(scope="session")  # one fit (~10 s) for every module here; the tests put back what they change
def untrained() -> tuple[nn.Module, object]:
    return network(0)
