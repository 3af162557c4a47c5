"""The trust checks on a CUDA device: the same verdicts as on the CPU, the model and every generator left alone,
and at most one host read per check (the final small numbers), under ``torch.cuda.set_sync_debug_mode``."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lightning_ig.callback.trust import deletion_check, randomization_check, randomization_reference, stability_check
from tests.support.trust import SETTINGS, assert_unchanged, attribute, snapshot

pytestmark = pytest.mark.gpu


def test_checks_run_on_the_device_with_one_host_read_each_and_leave_everything(trained, cuda_device):
    model, states = trained
    model, states = copy.deepcopy(model).to(cuda_device), states.to(cuda_device)
    units = attribute(model, states)
    reference = randomization_reference(model, states, settings=SETTINGS)
    before = snapshot(model)
    torch.cuda.synchronize(cuda_device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sanity = randomization_check(units, reference)  # the units are read once
            deletion = deletion_check(model, states, None, units, settings=SETTINGS)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [item for item in caught if "synchroniz" in str(item.message)]
    assert len(syncs) <= 2, [str(item.message) for item in syncs]
    stability = stability_check(model, states, None, units, settings=SETTINGS)
    assert_unchanged(model, before)  # parameters, noise buffers, modes, the CPU and CUDA generators
    assert sanity.passed and deletion.passed and stability.passed, (sanity, deletion, stability)
