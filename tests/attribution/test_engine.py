"""The reusable engine's graph cache on the CPU: capture, replay, fallbacks and input checks, with the capture
emulated (tests/support/graphs.py) and passed in through IntegratedGradients(graph_capture=...)."""

from __future__ import annotations

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from tests.support.graphs import EmulatedCapture
from tests.support.models import seeded_dueling
from tests.support.tolerance import assert_close_scaled


def test_graph_cache_replays_with_new_inputs_and_in_place_weight_updates() -> None:
    capture = EmulatedCapture()
    model = seeded_dueling(5, 3, seed=40)
    engine = IntegratedGradients(model, graph_capture=capture, target="mean", n_steps=10)
    x = torch.randn(4, 5, dtype=torch.float64)
    first = engine.attribute(x)
    assert engine.last_mode == "capture" and first.cuda_graph and len(capture.graphs) == 1
    assert_close_scaled(
        first.attributions,
        integrated_gradients(model, x, target="mean", n_steps=10).attributions,
        ulps=4,
        dtype=torch.float64,
    )
    second = engine.attribute(x)  # the fast path
    assert engine.last_mode == "graph" and capture.graphs[0].replays == 2
    assert torch.equal(second.attributions, first.attributions)
    second.attributions.zero_()  # results are copies: the next replay is unaffected
    fresh = torch.randn(4, 5, dtype=torch.float64)
    replayed = engine.attribute(fresh)
    expected = integrated_gradients(model, fresh, target="mean", n_steps=10)
    torch.testing.assert_close(replayed.attributions, expected.attributions, rtol=0, atol=0)
    torch.testing.assert_close(replayed.delta, expected.delta, rtol=0, atol=0)
    assert torch.equal(replayed.degenerate, expected.degenerate) and torch.equal(replayed.baselines, expected.baselines)
    assert torch.equal(replayed.non_finite, expected.non_finite) and replayed.target == expected.target == "mean"
    with torch.no_grad():
        model.body[0].weight.mul_(1.5)
    updated = engine.attribute(fresh)
    assert_close_scaled(
        updated.attributions,
        integrated_gradients(model, fresh, target="mean", n_steps=10).attributions,
        ulps=4,
        dtype=torch.float64,
    )
    engine.attribute(torch.randn(6, 5, dtype=torch.float64))  # a new shape: a second capture
    assert len(capture.graphs) == 2 and engine.last_mode == "capture"


def test_a_replay_says_which_rule_ran_as_the_eager_call_does() -> None:
    model = seeded_dueling(5, 3, seed=42)
    engine = IntegratedGradients(model, graph_capture=EmulatedCapture(), target="mean")  # method="auto"
    x = torch.randn(4, 5, dtype=torch.float64)
    eager = integrated_gradients(model, x, target="mean")
    captured, replayed = engine.attribute(x), engine.attribute(x)  # the second by the fast path
    assert engine.last_mode == "graph"
    assert eager.method != "auto" and captured.method == replayed.method == eager.method
    assert captured.n_steps == replayed.n_steps == eager.n_steps


@pytest.mark.parametrize("baselines", ["mean", 0.5, "tensor"])
def test_graph_cache_with_baselines_and_per_row_targets(baselines: object) -> None:
    capture = EmulatedCapture()
    model = seeded_dueling(5, 3, seed=41)
    engine = IntegratedGradients(model, graph_capture=capture, n_steps=7)
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 5, generator=generator, dtype=torch.float64)
        given = torch.randn(5, generator=generator, dtype=torch.float64) if baselines == "tensor" else baselines
        rows = torch.tensor([seed % 3, 2, 0, 1])
        result = engine.attribute(x, given, target=rows)
        expected = integrated_gradients(model, x, given, target=rows, n_steps=7)
        torch.testing.assert_close(result.attributions, expected.attributions, rtol=0, atol=0)
        torch.testing.assert_close(result.baselines, expected.baselines, rtol=0, atol=0)
        assert result.target == "per_row"
    assert len(capture.graphs) == 1 and engine.last_mode == "graph"


def test_graph_replays_check_their_inputs_for_nan_at_every_call_unless_told_not_to() -> None:
    model = seeded_dueling(3, 2, seed=42)
    engine = IntegratedGradients(model, graph_capture=EmulatedCapture(), target=1, n_steps=4)
    x = torch.randn(2, 3, dtype=torch.float64)
    engine.attribute(x)
    engine.attribute(x)
    assert engine.last_mode == "graph"
    x[0, 0] = float("nan")  # modified in place: the replay's check sees it
    with pytest.raises(ValueError, match="inputs holds 1 NaN/Inf"):
        engine.attribute(x)
    unchecked = IntegratedGradients(model, graph_capture=EmulatedCapture(), target=1, n_steps=4, check_finite=False)
    x[0, 0] = 0.0
    unchecked.attribute(x)
    x[0, 0] = float("nan")
    assert not torch.isfinite(unchecked.attribute(x).f_input[0])  # flagged in the result, not raised


def test_graph_cache_rejects_per_row_targets_out_of_range() -> None:
    model = seeded_dueling(3, 2, seed=45)
    engine = IntegratedGradients(model, graph_capture=EmulatedCapture(), n_steps=4)
    x = torch.randn(2, 3, dtype=torch.float64)
    engine.attribute(x, target=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="target holds index 2, out of range for a forward with 2 outputs"):
        engine.attribute(x, target=torch.tensor([2, 1]))


def test_graph_cache_keeps_the_most_recent_plans_and_drops_the_fast_path_with_its_plan() -> None:
    capture = EmulatedCapture()
    model = seeded_dueling(3, 2, seed=47)
    engine = IntegratedGradients(model, graph_capture=capture, target="mean", n_steps=4)
    first = torch.randn(1, 3, dtype=torch.float64)
    engine.attribute(first)
    engine.attribute(first)
    assert engine.last_mode == "graph"
    for batch in range(2, 11):  # nine more shapes: the first plan is evicted
        engine.attribute(torch.randn(batch, 3, dtype=torch.float64))
    assert len(capture.graphs) == 10
    engine.attribute(first)
    assert engine.last_mode == "capture" and len(capture.graphs) == 11  # captured again, not replayed stale


def test_non_finite_results_replay_as_flagged() -> None:
    model = seeded_dueling(3, 2, seed=48)
    engine = IntegratedGradients(model, graph_capture=EmulatedCapture(), target="mean", n_steps=4)
    x = torch.randn(3, 3, dtype=torch.float64)
    assert engine.attribute(x).num_non_finite == 0
    with torch.no_grad():
        model.value.weight[0, 0] = float("nan")  # the weights diverge between two runs, in place
    result = engine.attribute(x)
    assert engine.last_mode == "graph" and result.cuda_graph
    assert result.non_finite.all() and result.worst_relative_error == float("inf")
