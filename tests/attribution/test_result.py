"""What the engine says about results that cannot be trusted: non-finite forwards and attributions,
states that cannot be checked, stochastic forwards, and inputs the engine cannot attribute."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lightning_ig.attribution import (
    IntegratedGradients,
    StochasticForwardWarning,
    integrated_gradients,
    target_forward,
)
from lightning_ig.attribution.quadrature import MAX_GAUSS_LEGENDRE_STEPS
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.models import DuelingQNetwork, noise_disabled
from lightning_ig.ops.ig import warp_order_sum
from lightning_ig.run.statistics import accuracy_verdict, completeness
from tests.support.graphs import EmulatedCapture
from tests.support.tolerance import eps


def _mlp(
    features: int, outputs: int, *, seed: int, dtype: torch.dtype = torch.float64, extra: list | None = None
) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(features, 16), torch.nn.Tanh(), *(extra or []), torch.nn.Linear(16, outputs)]
    return torch.nn.Sequential(*layers).to(dtype).eval()


# --------------------------------------------------------------------------- non-finite is never clean


def test_an_infinite_forward_is_flagged_and_never_scores_zero() -> None:
    # A forward that overflows must read inf, not worst_relative_error == 0.0 (inf counted as degenerate, skipped).
    result = integrated_gradients(lambda t: (t * 1e38).sum(1) * 10, torch.ones(3, 4))
    assert result.worst_relative_error == math.inf
    assert result.non_finite.tolist() == [True, True, True]
    assert result.degenerate.tolist() == [False, False, False]  # non-finite is not "degenerate"
    assert torch.isinf(result.relative_error).all()
    assert result.num_non_finite == 3 and result.first_non_finite == 0
    assert result.num_checked == 0 and result.num_degenerate == 0
    assert not result.stochastic  # the same infinity twice is a repeat, not a random forward


def test_one_nan_state_among_clean_ones() -> None:
    x = torch.tensor([[1.0, 2.0], [-1.0, 3.0], [0.5, 0.25]], dtype=torch.float64)
    result = integrated_gradients(lambda z: torch.sqrt(z).sum(1), x, torch.full_like(x, 4.0), n_steps=32)
    assert result.non_finite.tolist() == [False, True, False]  # sqrt(-1): F(x) is NaN for state 1 only
    assert result.num_non_finite == 1 and result.first_non_finite == 1 and result.num_checked == 2
    assert result.relative_error[1] == math.inf
    assert math.isfinite(float(result.relative_error[0])) and math.isfinite(float(result.relative_error[2]))
    assert result.worst_relative_error == math.inf
    assert not result.stochastic  # NaN twice on the same row is a repeat


def test_a_nan_weight_makes_every_state_non_finite() -> None:
    model = _mlp(4, 1, seed=1)
    with torch.no_grad():
        model[0].weight[2, 1] = float("nan")  # a diverged model, as in a checkpoint with one NaN weight
    result = integrated_gradients(lambda z: model(z).squeeze(1), torch.randn(5, 4, dtype=torch.float64))
    assert result.non_finite.all() and result.worst_relative_error == math.inf
    assert result.num_non_finite == 5 and result.first_non_finite == 0


def test_finite_forward_values_with_infinite_attributions_are_non_finite() -> None:
    # sqrt'(0) = inf at the path's start (riemann_left samples alpha = 0): F(x), F(b) finite, attributions not.
    x = torch.tensor([[1.0, 4.0]], dtype=torch.float64)
    result = integrated_gradients(lambda z: torch.sqrt(z).sum(1), x, n_steps=4, method="riemann_left")
    assert torch.isfinite(result.f_input).all() and torch.isfinite(result.f_baseline).all()
    assert not torch.isfinite(result.attributions).all()
    assert result.non_finite.tolist() == [True] and result.worst_relative_error == math.inf


def test_non_finite_per_action_for_target_each() -> None:
    def forward(z: torch.Tensor) -> torch.Tensor:
        columns = torch.stack([z.sum(1), torch.log(z[:, 0]), (z**2).sum(1)], dim=1)  # (N, 3)
        return columns

    x = torch.tensor([[2.0, 1.0], [0.5, 1.0]], dtype=torch.float64)
    result = integrated_gradients(forward, x, torch.ones_like(x), target="each", n_steps=8)
    assert result.non_finite.shape == (3, 2)
    assert result.non_finite.tolist() == [[False, False], [False, False], [False, False]]
    below_zero = torch.tensor([[2.0, 1.0], [-0.5, 1.0]], dtype=torch.float64)
    result = integrated_gradients(forward, below_zero, torch.ones_like(x), target="each", n_steps=8)
    assert result.non_finite.tolist() == [[False, False], [False, True], [False, False]]  # log(-0.5): action 1, state 1
    assert result.first_non_finite == 1 and result.num_non_finite == 1 and result.num_checked == 5


@pytest.mark.parametrize("method", ["auto", "riemann_middle", "gausslegendre"])
def test_a_forward_with_zero_gradient_where_its_value_changes_fails(method: str) -> None:
    # round(4 Q) / 4: a step function of the input, its gradient zero almost everywhere. Every attribution is zero
    # while F(x) - F(b) is not: completeness fails by 100%, the verdict says so (never "nothing could be checked").
    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).eval()
    with torch.no_grad():
        net[2].weight.mul_(20.0)  # values that move by several quarter steps between baseline and state

    def stepped(z: torch.Tensor) -> torch.Tensor:
        return torch.round(net(z)[:, 0] * 4) / 4

    states = torch.randn(16, 4)
    result = integrated_gradients(stepped, states, n_steps=16, method=method)
    moved = (result.f_input - result.f_baseline) != 0
    assert bool(moved.sum() > 8) and float(result.attributions.abs().max()) == 0.0
    assert result.near_baseline.tolist() == (~moved).tolist()  # only the states whose value did not move
    # 1 less the values' rounding floor (NOISE eps (|F(x)| + |F(b)|) / |dF|: values of a few units, steps of 1/4)
    assert result.worst_mass_relative_error == pytest.approx(1.0, abs=1024 * eps())
    # all-zero attributions where the exact ones are not: 100% off (the estimate read 0/0 as 0), 0 at the baseline
    assert result.attribution_error.tolist() == moved.double().tolist()
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01)
    assert verdict.within is False and verdict.figure in ("attribution_error", "mass_relative_error")
    summary = completeness(result, 0.01)  # the run's numbers (the callback's and diag's path) agree
    assert summary.verdict == "fail" and summary.num_near_baseline == int((~moved).sum())


def test_the_completeness_sum_is_in_a_fixed_order_whatever_the_thread_count() -> None:
    generator = torch.Generator().manual_seed(3)
    values = torch.randn(2, 3, 1000, generator=generator) * torch.logspace(-6, 6, 1000)
    sums = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            sums.append(warp_order_sum(values))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(sums[0], sums[1])
    exact = values.double().sum(-1)
    # 1000 float32 additions (32 chains of 32, then a 5-level tree) of numbers up to |values|.max()
    assert (sums[0].double() - exact).abs().max() <= 37 * eps(torch.float32) * float(values.abs().sum(-1).max())


# --------------------------------------------------------------------------- n_steps="auto" never stops on NaN


def test_auto_stops_at_once_on_a_non_finite_state() -> None:
    calls: list[int] = []

    def forward(z: torch.Tensor) -> torch.Tensor:
        calls.append(z.shape[0])
        return (z * 1e38).sum(1) * 10

    result = integrated_gradients(forward, torch.ones(3, 4), n_steps="auto")
    assert result.n_steps == 56 and result.worst_relative_error == math.inf
    assert result.worst_attribution_error == math.inf and result.worst_mass_relative_error == math.inf
    # the first rule and the ends (twice: the stochastic check); no certificate (no state reads kinked: the path's
    # roughness is NaN), no refinement
    assert calls == [(56 + 4) * 3]


# --------------------------------------------------------------------------- stochastic forwards


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_dropout_in_train_mode_warns_and_flags(gradient: str) -> None:
    model = _mlp(5, 3, seed=4, extra=[torch.nn.Dropout(0.5)]).train()
    x = torch.randn(4, 5, dtype=torch.float64)
    with pytest.warns(StochasticForwardWarning, match=r"2 \(Dropout in train mode\).*model.eval\(\)"):
        result = integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=8)
    assert result.stochastic
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=8).stochastic


class _WarnsOnce(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)  # shown once at this place
        return x.sum(dim=1)


def test_silenced_runs_keep_the_once_per_place_memory_of_the_users_warnings() -> None:
    model, x = _WarnsOnce(), torch.randn(3, 4, dtype=torch.float64)
    dropout = _mlp(5, 3, seed=4, extra=[torch.nn.Dropout(0.5)]).train()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # once per place, as Python's default filters show a UserWarning
        for _ in range(3):  # as the callback's runs do, each in its own silenced block
            with stochastic_warnings_silenced():
                integrated_gradients(model, x, n_steps=4)
                assert integrated_gradients(
                    dropout, torch.randn(4, 5, dtype=torch.float64), target=0, n_steps=4
                ).stochastic
    assert [str(w.message) for w in seen] == ["the user's own warning"]


def test_noisynet_noise_left_on_is_warned_though_its_fixed_sample_repeats() -> None:
    # a fresh NoisyNet model is in train mode: one noise sample, the same for the repeated ends (not flagged), and
    # the attributions are that sample's (the mean weights' differ by about their own size)
    model = DuelingQNetwork(4, 2, hidden_sizes=(16,))
    x = torch.randn(5, 4)
    with pytest.warns(
        StochasticForwardWarning, match=r"NoisyNet noise on \(.*noise on\)\): the attributions are of one"
    ):
        noisy = integrated_gradients(model, x, target="mean", n_steps=8)
    assert not noisy.stochastic
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)
        with noise_disabled(model):  # still in train mode: the noise switch alone is enough
            mean = integrated_gradients(model, x, target="mean", n_steps=8)
    assert not torch.allclose(noisy.attributions, mean.attributions, rtol=0.1)


def test_batch_norm_in_train_mode_warns_and_flags() -> None:
    model = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16)]).train()
    x = torch.randn(6, 5, dtype=torch.float64)
    with pytest.warns(StochasticForwardWarning, match="BatchNorm1d in train mode"):
        result = integrated_gradients(target_forward(model, 0), x, n_steps=8)
    assert result.stochastic


def _batch_norm_state(model: torch.nn.Module) -> list[torch.Tensor]:
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    return [norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone()]


@pytest.mark.parametrize(
    ("gradient", "n_steps", "chunk"),
    [("autograd", 8, None), ("autograd", 8, 5), ("finite_difference", 4, None), ("autograd", "auto", None)],
)
def test_train_mode_batch_norm_statistics_are_put_back(gradient: str, n_steps: int | str, chunk: int | None) -> None:
    # guards against: each of the engine's forwards moved running_mean / running_var and counted num_batches_tracked,
    # though
    # the model was promised to be left as it was
    model = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16)]).train()
    model(torch.randn(7, 5, dtype=torch.float64))  # statistics that are not the initial ones
    before = _batch_norm_state(model)
    with pytest.warns(StochasticForwardWarning, match="BatchNorm1d in train mode"):  # still warned: F(x) uses the batch
        result = integrated_gradients(
            target_forward(model, 0),
            torch.randn(6, 5, dtype=torch.float64),
            n_steps=n_steps,
            gradient=gradient,
            internal_batch_size=chunk,
        )
    assert result.stochastic
    for kept, now in zip(before, _batch_norm_state(model)):
        assert torch.equal(kept, now)
    assert model.training


def test_train_mode_batch_norm_statistics_are_put_back_by_every_graph_replay() -> None:
    model = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16)]).train()
    capture = EmulatedCapture()
    engine = IntegratedGradients(target_forward(model, 0), n_steps=8, graph_capture=capture)
    before = _batch_norm_state(model)
    with pytest.warns(StochasticForwardWarning):
        engine.attribute(torch.randn(6, 5, dtype=torch.float64))  # the eager run and the capture
    for _ in range(2):
        engine.attribute(torch.randn(6, 5, dtype=torch.float64))
    assert engine.last_mode == "graph" and capture.graphs[0].replays == 3  # the first call replays what it captured
    for kept, now in zip(before, _batch_norm_state(model)):
        assert torch.equal(kept, now)


def test_statistics_moved_by_a_failing_forward_are_put_back() -> None:
    model = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16)]).train()
    before = _batch_norm_state(model)

    def fails_after_the_norm(z: torch.Tensor) -> torch.Tensor:
        model(z)
        raise RuntimeError("the forward broke")

    fails_after_the_norm.__wrapped__ = model  # type: ignore[attr-defined]  # how the engine finds the model
    with pytest.raises(RuntimeError, match="the forward broke"):
        integrated_gradients(fails_after_the_norm, torch.randn(6, 5, dtype=torch.float64), n_steps=4)
    for kept, now in zip(before, _batch_norm_state(model)):
        assert torch.equal(kept, now)


def test_batch_statistics_in_eval_mode_are_flagged_too() -> None:
    # Without running statistics, batch-norm normalises with the batch's even in eval mode; identical rows in one
    # batch still agree, so this is found by looking at the module.
    model = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16, track_running_stats=False)]).eval()
    with pytest.warns(StochasticForwardWarning):
        assert integrated_gradients(
            target_forward(model, 0), torch.randn(6, 5, dtype=torch.float64), n_steps=8
        ).stochastic
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)
        clean = _mlp(5, 1, seed=5, extra=[torch.nn.BatchNorm1d(16)]).eval()  # running statistics: a function of the row
        assert not integrated_gradients(
            target_forward(clean, 0), torch.randn(6, 5, dtype=torch.float64), n_steps=8
        ).stochastic


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_dropout_is_caught_when_the_ends_fall_in_different_chunks(gradient: str) -> None:
    model = _mlp(5, 3, seed=4, extra=[torch.nn.Dropout(0.5)]).train()
    x = torch.randn(4, 5, dtype=torch.float64)
    with pytest.warns(StochasticForwardWarning):
        result = integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=8, internal_batch_size=3)
    assert result.stochastic


def test_noise_drawn_in_the_forward_is_flagged_with_the_generic_causes() -> None:
    def noisy(z: torch.Tensor) -> torch.Tensor:
        return z.sum(1) + 0.1 * torch.randn(z.shape[0], dtype=z.dtype)

    with pytest.warns(StochasticForwardWarning, match="dropout or batch-norm in train mode, or NoisyNet noise left on"):
        assert integrated_gradients(noisy, torch.randn(3, 4), n_steps=4).stochastic


@pytest.mark.parametrize("threads", [1, 2])
def test_deterministic_models_never_flag(threads: int) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", StochasticForwardWarning)
            for seed in range(2):
                for dtype in (torch.float32, torch.float64, torch.bfloat16):
                    model = _mlp(33, 4, seed=seed, dtype=dtype)
                    x = torch.randn(37, 33, dtype=torch.float32).to(dtype) * 3
                    for target in ("mean", "each", torch.arange(37) % 4):
                        assert not integrated_gradients(model, x, target=target, n_steps=16).stochastic
                    fd = integrated_gradients(
                        model, x, target=torch.arange(37) % 4, gradient="finite_difference", n_steps=4
                    )
                    assert not fd.stochastic
                    chunked = integrated_gradients(model, x, target="mean", n_steps=16, internal_batch_size=7)
                    assert not chunked.stochastic
    finally:
        torch.set_num_threads(previous)


def test_graph_capture_checks_once_and_replays_repeat_the_finding() -> None:
    capture = EmulatedCapture()
    model = _mlp(4, 2, seed=6, extra=[torch.nn.Dropout(0.3)]).train()
    engine = IntegratedGradients(model, graph_capture=capture, target="mean", n_steps=6)
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.warns(StochasticForwardWarning):
        first = engine.attribute(x)
    assert engine.last_mode == "capture" and first.stochastic
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)  # warned at capture, not at every replay
        again = engine.attribute(x)
    assert engine.last_mode == "graph" and again.stochastic and len(capture.graphs) == 1
    clean = IntegratedGradients(model.eval(), graph_capture=EmulatedCapture(), target="mean", n_steps=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)
        assert not clean.attribute(x).stochastic and not clean.attribute(x).stochastic
    assert clean.last_mode == "graph"


# --------------------------------------------------------------------------- inputs the engine cannot attribute


@pytest.mark.parametrize("shape", [(5, 0), (2, 3, 0)])
def test_inputs_without_features_are_one_clear_error(shape: tuple[int, ...]) -> None:
    with pytest.raises(
        ValueError, match=r"inputs must have shape \(num_states >= 1, \*feature_shape\) with at least one feature"
    ):
        integrated_gradients(lambda z: z.sum(1), torch.zeros(shape))
    with pytest.raises(ValueError, match="at least one feature"):
        IntegratedGradients(lambda z: z.sum(1)).attribute(torch.zeros(shape))


def test_inputs_of_another_dtype_than_the_model_say_how_to_fix_it() -> None:
    model = _mlp(4, 2, seed=7, dtype=torch.float32)
    x = torch.randn(3, 4, dtype=torch.float64)
    expected = (
        r"inputs are torch.float64 but the model's parameters are torch.float32.*inputs.float\(\) or model.double\(\)"
    )
    with pytest.raises(TypeError, match=expected):
        integrated_gradients(model, x, target="mean")
    with pytest.raises(TypeError, match=expected):
        integrated_gradients(target_forward(model, "mean"), x)
    with pytest.raises(TypeError, match=expected):
        integrated_gradients(model, x, target=1, gradient="finite_difference")
    with pytest.raises(TypeError, match=expected):
        IntegratedGradients(model, target="mean").attribute(x)
    with pytest.raises(TypeError, match=r"torch.float16.*inputs.float\(\) or model.half\(\)"):
        integrated_gradients(model, x.half(), target="mean")


def test_a_model_that_casts_its_inputs_itself_is_not_refused() -> None:
    class Casting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.linear(z.float()).squeeze(1).to(z.dtype)

    result = integrated_gradients(Casting(), torch.randn(3, 4, dtype=torch.float64), n_steps=8)
    assert result.attributions.dtype == torch.float64 and not result.stochastic


def test_too_many_gauss_legendre_steps_fail_before_any_forward() -> None:
    calls: list[int] = []

    def forward(z: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return z.sum(1)

    gauss = {"method": "gausslegendre"}
    with pytest.raises(ValueError, match=rf"n_steps={MAX_GAUSS_LEGENDRE_STEPS + 1} is more than.*riemann_trapezoid"):
        integrated_gradients(forward, torch.ones(2, 3), n_steps=MAX_GAUSS_LEGENDRE_STEPS + 1, **gauss)
    with pytest.raises(ValueError, match=rf"n_steps={MAX_GAUSS_LEGENDRE_STEPS + 1}"):
        IntegratedGradients(forward, n_steps=MAX_GAUSS_LEGENDRE_STEPS + 1, **gauss)
    with pytest.raises(ValueError, match="n_steps='auto' refines by tripling the midpoint nodes"):
        IntegratedGradients(forward, n_steps="auto", method="riemann_trapezoid")
    assert calls == []


# ---------------------------------------------------------------- feature groups (lightning_ig/attribution/groups.py)


def test_grouped_attributions_keep_completeness_per_state() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 3, 4)).double().eval()
    x = torch.randn(5, 2, 3, 3, dtype=torch.float64)
    result = integrated_gradients(model, x, target="mean", n_steps=8)
    channels = result.grouped("channels")
    assert channels.shape == (5, 2)
    assert torch.equal(channels, result.attributions.sum(dim=(2, 3)))  # contiguous groups: a reshape and a sum
    each = integrated_gradients(model, x, target="each", n_steps=8)
    per_action = each.grouped({"left": [0, 1, 2], "right": [3, 4, 5]})
    assert per_action.shape == (4, 5, 3)  # two named groups and "other"
    size = float(each.attributions.abs().sum(dim=(2, 3, 4)).max())
    assert (per_action.sum(-1) - each.attributions.sum(dim=(2, 3, 4))).abs().max() <= 64 * eps(torch.float64) * size


def test_a_model_on_the_meta_device_says_to_load_its_weights_not_torch() -> None:
    # guards against: torch's own "Expected all tensors to be on the same device ..." from inside the forward, and
    # advice that cannot work there (model.to('cpu') gives a meta model no values; test_eager_gpu has a real move)
    model = _mlp(4, 2, seed=1).to("meta")
    with pytest.raises(ValueError, match=r"meta device \(shapes without values\): load its weights first"):
        integrated_gradients(model, torch.randn(3, 4, dtype=torch.float64), target="mean", n_steps=4)


@pytest.mark.parametrize("engine", ["function", "class"])
def test_inputs_of_a_shape_the_model_does_not_take_are_named_as_the_inputs(engine: str) -> None:
    # guards against: torch's "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x16)", whose row count is a probe
    # the engine built, read as if it were the user's batch
    model = _mlp(4, 2, seed=1).eval()
    x = torch.randn(3, 5, dtype=torch.float64)
    with pytest.raises(
        RuntimeError, match=r"each of 5 values.*do the inputs have the shape the model takes\? torch: mat1"
    ):
        if engine == "function":
            integrated_gradients(model, x, target=0, n_steps=4)
        else:
            IntegratedGradients(model, target=0, n_steps=4).attribute(x)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()).double().eval()
    with pytest.raises(RuntimeError, match=r"each of 200 values.*the shape the model takes\? torch: .*channels"):
        integrated_gradients(conv, torch.randn(2, 2, 10, 10, dtype=torch.float64), target=0, n_steps=4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_lower_median_is_torchs_nanmedian_over_the_last_dim(dtype: torch.dtype) -> None:
    # the near-baseline median is taken as a quantile (CUDA's median with a dim has no deterministic kernel, so it
    # raised under Trainer(deterministic=True)): the same values as torch.nanmedian, NaN rows and ties included
    from lightning_ig.attribution.result import lower_median

    generator = torch.Generator().manual_seed(0)
    for batch in range(1, 10):
        values = torch.randn(3, batch, generator=generator).abs().round(decimals=1).to(dtype)
        values[torch.rand(3, batch, generator=generator) < 0.3] = math.nan
        values[0] = math.nan  # no finite scale at all: NaN, as nanmedian gives
        expected = torch.nanmedian(values, dim=-1, keepdim=True).values
        got = lower_median(values)
        assert got.dtype == dtype and got.shape == (3, 1)
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.nan_to_num(-1), expected.nan_to_num(-1))
