"""The trust checks on a CUDA device: the same verdicts as on the CPU, the model and every generator left alone, the
working copy's IG replayed, and each check's launches and host syncs counted (``torch.cuda.set_sync_debug_mode``:
one host read per check, its small numbers at the end).

Run with ``-s`` to see the counts::

    PYTHONPATH=. python -m pytest -m gpu -s tests/trust/test_checks_gpu.py
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from lightning_ig.trust import DeletionPlan, Replica, randomization_check, randomization_reference
from lightning_ig.trust.stability import stability_check
from tests.support.trust import SETTINGS, assert_unchanged, attribute, snapshot

pytestmark = pytest.mark.gpu


def _counted(work: Callable[[], Any]) -> tuple[Any, int, int]:
    """``work()`` with its host syncs (sync debug mode's warnings) and its kernel and graph launches counted."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught, profile(activities=[ProfilerActivity.CUDA]) as traced:
            warnings.simplefilter("always")
            result = work()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(item.message) for item in caught)
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")
    launches = sum(event.name.startswith(names) for event in traced.events())
    return result, syncs, launches


def test_checks_run_on_the_device_with_one_host_read_each_and_leave_everything(trained, cuda_device):
    model, states = trained
    model, states = copy.deepcopy(model).to(cuda_device), states.to(cuda_device)
    units = attribute(model, states)
    host_units = units.double().cpu().numpy()  # what the callback passes: the gathered result, on the host
    before = snapshot(model)
    replica = Replica(model, SETTINGS)
    reference = randomization_reference(model, states, settings=SETTINGS, replica=replica)
    assert replica.engine.last_mode == "graph"  # captured at the first copy, replayed for the others
    plan = DeletionPlan(states, None)

    def deletion() -> Any:
        replica.sync()
        return plan.run(SETTINGS.value(replica.module), host_units)

    deletion()  # the first call allocates
    sanity, sanity_syncs, _ = _counted(lambda: randomization_check(host_units, reference))
    result, deletion_syncs, deletion_launches = _counted(deletion)
    stability_check(model, states, None, host_units, settings=SETTINGS, replica=replica)  # its draws, made once
    stability, stability_syncs, stability_launches = _counted(
        lambda: stability_check(model, states, None, host_units, settings=SETTINGS, replica=replica)
    )
    print(
        f"\nsanity: {sanity_syncs} syncs; deletion: {deletion_syncs} syncs, {deletion_launches} launches; "
        f"stability: {stability_syncs} syncs, {stability_launches} launches"
    )
    assert sanity_syncs == 0  # host units: rank correlations on the host only
    assert deletion_syncs <= 1 and stability_syncs <= 1  # the one read of their numbers
    assert deletion_launches <= 80  # one batched forward, no per-fraction loop
    assert replica.engine.last_mode == "graph"  # the noise draws replayed the copy's graph
    assert_unchanged(model, before)  # parameters, noise buffers, modes, the CPU and CUDA generators
    assert sanity.passed and result.passed and stability.passed, (sanity, result, stability)
