"""The held-out states at set-up: their precision kept, a copy taken, and what the set-up trial catches."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ig import IntegratedGradientsCallback, NonFiniteAttributionError
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import heldout
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer


class Linear64(pl.LightningModule):
    """A float64 linear Q-network: IG of the mean output is exact, ``(x - b) * mean_a W[a]``."""

    def __init__(self, lr: float = 0.0) -> None:
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(3, 2, dtype=torch.float64)
        with torch.no_grad():  # the timestamp feature weighs 0.4 in the mean output: ~10 of attribution per state
            self.layer.weight.copy_(torch.tensor([[0.5, -0.2, 0.3], [0.3, 0.1, -0.4]], dtype=torch.float64))
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)  # (N, 2)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def timestamp_states(n: int = 24) -> torch.Tensor:
    """A feature like a Unix time (1.7e9 + 0..100 s): float32 rounds it to multiples of 128."""
    generator = torch.Generator().manual_seed(3)
    states = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    states[:, 0] = 1.7e9 + torch.linspace(0, 100, n, dtype=torch.float64)
    return states


def loader64() -> DataLoader:
    x = timestamp_states(32)
    return DataLoader(TensorDataset(x, torch.zeros(32, 2, dtype=torch.float64)), batch_size=8)


def test_float64_states_and_mean_baseline_are_not_rounded(tmp_path: Path) -> None:
    states = timestamp_states()
    model = Linear64()
    callback = IntegratedGradientsCallback(states, every_n_steps=10_000, baseline="mean")
    trainer = make_trainer(tmp_path, [callback], max_steps=2, precision="64-true")
    trainer.fit(model, loader64())
    weights = model.layer.weight.detach().mean(dim=0)  # (3,): d mean_a Q / dx
    exact = ((states - states.mean(dim=0)) * weights).abs().mean(dim=0)  # (3,) mean |attribution| per feature
    got = torch.tensor(callback.history[-1]["mean_abs"], dtype=torch.float64)
    # Sums of ~24 products of values near 1.7e9: rounding of the inputs' size, never float32's 128-s steps.
    tolerance = 64 * torch.finfo(torch.float64).eps * 1.7e9 * float(weights.abs().max())
    torch.testing.assert_close(got, exact, atol=tolerance, rtol=0)
    assert float(exact[0]) > 1.0  # the timestamp feature carries attribution that float32 would have garbled


def test_resolve_states_keeps_the_dtype_and_copies() -> None:
    states = timestamp_states()
    resolved = heldout.resolve_states(states, None, None)
    assert resolved.dtype == torch.float64
    assert torch.equal(resolved, states)
    assert resolved.data_ptr() != states.data_ptr()


def test_states_are_copied_when_the_callback_is_made() -> None:
    states = held_out_states()
    kept = states.clone()
    callback = IntegratedGradientsCallback(states)
    states.mul_(0)  # the caller reuses its tensor before the fit starts
    assert torch.equal(callback.states, kept)


def test_a_tensor_baseline_is_copied_and_keeps_its_dtype() -> None:
    baseline = torch.full((3,), 1.7e9 + 0.25, dtype=torch.float64)
    checked = heldout.check_baseline(baseline)
    baseline.zero_()
    assert checked.dtype == torch.float64 and float(checked[0]) == 1.7e9 + 0.25


@pytest.mark.parametrize(
    ("baseline", "kind"), [(torch.zeros(4, device="meta"), "on the meta device"), (torch.eye(4).to_sparse(), "sparse")]
)
def test_a_baseline_without_dense_values_is_refused_when_the_callback_is_made(
    baseline: torch.Tensor, kind: str
) -> None:
    # guards against: torch's "Cannot copy out of meta tensor; no data!" (NotImplementedError) and "unsupported memory
    # format option Contiguous" from inside the baseline's copy, as the states are refused
    with pytest.raises(ValueError, match=f"baseline is (a torch.)?{kind}.*pass a dense tensor with values"):
        IntegratedGradientsCallback(held_out_states(), baseline=baseline)


def test_nan_seen_by_the_set_up_trial_stops_the_fit_before_training(tmp_path: Path) -> None:
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    with torch.no_grad():
        model.body[0].weight[0, 0] = float("nan")
    steps: list[int] = []

    class Count(pl.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            steps.append(1)

    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000, on_non_finite="raise")
    trainer = make_trainer(tmp_path, [callback, Count()], max_steps=20)
    with pytest.raises(NonFiniteAttributionError, match="set-up trial"):
        trainer.fit(model, DataLoader(dataset(), batch_size=32))
    assert steps == []


class _NanGradient(TinyQNet):
    """Finite values everywhere, a NaN gradient: the square root of the branch ``torch.where`` does not take."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = x[:, :1]
        return super().forward(x) + torch.where(first > 100, torch.sqrt(first - 100), 0.0)


@pytest.mark.parametrize("target", ["mean", "each"])
def test_a_nan_gradient_of_finite_values_is_told_as_such(tmp_path: Path, target: str) -> None:
    """It was "the model gave NaN/Inf ...; check the model's weights and the states", all of which were finite (and
    for "each", "on 74 of 37 held-out states": its (action, state) cells)."""
    model, states = _NanGradient(noisy=False, batchnorm=False, dropout=0.0), held_out_states()
    assert bool(torch.isfinite(model(states)).all())
    callback = IntegratedGradientsCallback(states, every_n_steps=10_000, on_non_finite="raise", target=target)
    trainer = make_trainer(tmp_path, [callback], max_steps=2)
    told = rf"the gradient along the path was NaN/Inf on {len(states)} of {len(states)} held-out states .*torch.where"
    with pytest.raises(NonFiniteAttributionError, match=told):
        trainer.fit(model, DataLoader(dataset(), batch_size=32))


class _Returns(TinyQNet):
    def __init__(self, kind: str) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> object:
        q = super().forward(x)
        return (q, q.sum(-1)) if self.kind == "tuple" else q.argmax(-1)


@pytest.mark.parametrize(("kind", "seen"), [("tuple", "tuple"), ("actions", "torch.int64 values")])
def test_an_output_ig_cannot_read_is_refused_with_the_forward_to_pass(tmp_path: Path, kind: str, seen: str) -> None:
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10)
    refused = f"the model returned {seen} on the held-out states; IG needs floating-point values \\(N,\\) or \\(N, A\\)"
    refused += ", not actions: pass forward=" if kind == "actions" else ": pass forward="  # a tuple is no action
    with pytest.raises(TypeError, match=refused):
        make_trainer(tmp_path, [callback], max_steps=2).fit(_Returns(kind), DataLoader(dataset(), batch_size=32))


@pytest.mark.parametrize(
    ("forward", "refused"),
    [
        (
            lambda m, x: m(x).argmax(-1),
            "returned torch.int64 values .*, not actions: make it return one value per state",
        ),
        (lambda m, x: (m(x)[:, 0],), "returned tuple .*: make it return one value per state, e.g. q.max"),
        (
            lambda m, x: m(x)[:, 0].sum(),
            r"returned shape \(\), not one row per state; .* \(no sum or mean over the batch\)",
        ),
    ],
)
def test_an_output_of_the_forward_callable_is_refused_as_its_own(tmp_path: Path, forward: Any, refused: str) -> None:
    # guards against: "the model returned torch.int64 values ...: pass forward=callable(pl_module, x)", which blamed
    # the model and asked for the forward= the user had passed
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, forward=forward)
    with pytest.raises((TypeError, ValueError), match="the forward callable <lambda> " + refused):
        make_trainer(tmp_path, [callback, _NoTraining()], max_steps=2).fit(
            TinyQNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=32)
        )


class _ValueHead(pl.LightningModule):
    """A regression model: one value per state as ``nn.Linear(hidden, 1)`` gives it, ``(N, 1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # (N, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x)[:, 0], y[:, 0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_one_value_per_state_as_a_column_is_attributed_as_that_value(tmp_path: Path) -> None:
    # guards against: a (N, 1) output reported as target "mean" (V(s)) where diag, and a (N,) output, said "output";
    # and forward=lambda m, x: m.value(x) with an (N, 1) head refused with "pick it inside, e.g. q.max(-1).values"
    reports = {}
    for name, forward in (("model", None), ("column", lambda m, x: m(x)), ("flat", lambda m, x: m(x)[:, 0])):
        callback = IntegratedGradientsCallback(
            held_out_states(), every_n_steps=100, forward=forward, report_dir=tmp_path / name, overhead=None
        )
        pl.seed_everything(0)
        make_trainer(tmp_path, [callback], max_steps=2).fit(_ValueHead(), DataLoader(dataset(), batch_size=32))
        reports[name] = json.loads(next((tmp_path / name).glob("*.json")).read_text())
    assert reports["model"]["forward_target"] == "output"
    assert reports["column"]["features"] == reports["flat"]["features"] == reports["model"]["features"]


def test_nan_in_the_set_up_trial_only_warns_by_default(tmp_path: Path) -> None:
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    with torch.no_grad():
        model.body[0].weight[0, 0] = float("nan")
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000, run_at_train_end=False)
    make_trainer(tmp_path, [callback], max_steps=2).fit(model, DataLoader(dataset(), batch_size=32))


class CountsCalls(TinyQNet):
    """A forward that changes a buffer even in eval mode: every IG run would change what training sees."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.body(x)


def test_a_forward_that_changes_a_buffer_is_refused_at_set_up(tmp_path: Path) -> None:
    model = CountsCalls()
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=5)
    with pytest.raises(ValueError, match="buffer.*calls"):
        make_trainer(tmp_path, [callback], max_steps=5).fit(model, DataLoader(dataset(), batch_size=32))
    assert float(model.calls) == 0.0  # put back as it was


class LazyQNet(TinyQNet):
    """TinyQNet whose first layer is an ``nn.LazyLinear``: its weights are drawn at the first forward."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.body[0] = torch.nn.LazyLinear(16)


def test_lazy_parameters_the_set_up_trial_would_initialise_are_warned_of(tmp_path: Path) -> None:
    """The set-up trial's forward drew a lazy layer's weights before training's first step, from other generator
    states: training was silently not the same as without the callback. It is said, with what keeps it the same."""

    def fit(model: TinyQNet, callbacks: list) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        folder = tmp_path / str(len(list(tmp_path.iterdir())))  # each fit its own reports
        make_trainer(folder, callbacks, max_steps=2).fit(model, DataLoader(dataset(), batch_size=32))
        return model.state_dict()

    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, overhead=None)
    with pytest.warns(UserWarning, match=r"lazy parameters body\.0\.weight, body\.0\.bias .*one forward"):
        fit(LazyQNet(), [callback])
    initialised = LazyQNet()
    initialised(torch.zeros(1, 4))  # the advice: one forward before fit
    alone = LazyQNet()
    alone.load_state_dict(initialised.state_dict())
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "IntegratedGradientsCallback: the model's lazy")
        beside = fit(initialised, [IntegratedGradientsCallback(held_out_states(), every_n_steps=10, overhead=None)])
    assert all(torch.equal(value, beside[name]) for name, value in fit(alone, []).items())


def test_a_forward_that_fails_on_bigger_batches_fails_at_set_up(tmp_path: Path) -> None:
    def forward(module: TinyQNet, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise RuntimeError("out of workspace")
        return module(x).mean(dim=1)

    callback = IntegratedGradientsCallback(held_out_states(16), every_n_steps=5, forward=forward)
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    with pytest.raises(ValueError, match=r"forward callable .*forward.* failed .*16 at once.*out of workspace"):
        make_trainer(tmp_path, [callback], max_steps=5).fit(model, DataLoader(dataset(), batch_size=32))


def test_a_callback_reused_by_a_second_trainer_starts_afresh(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=4, report_dir=reports)
    loader = DataLoader(dataset(), batch_size=32)
    make_trainer(tmp_path, [callback], max_steps=8).fit(TinyQNet(), loader)
    assert [entry["global_step"] for entry in callback.history] == [4, 8]  # the run at step 8 is the end's too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=4).fit(TinyQNet(), loader)
    assert [entry["global_step"] for entry in callback.history] == [4]  # this fit's runs only
    assert any("earlier fit" in str(warning.message) for warning in caught)


@pytest.mark.parametrize(("engine", "n_steps"), [(None, "auto"), (IGOptions(n_steps=8), 8)])
def test_on_a_cpu_the_default_budget_runs_refine_their_worst_states(tmp_path: Path, engine, n_steps) -> None:
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000, engine=engine)
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    make_trainer(tmp_path, [callback], max_steps=2).fit(model, DataLoader(dataset(), batch_size=32))
    assert callback._fit is not None and callback._fit.engine.options.n_steps == n_steps
    assert callback.engine.n_steps == ("budget" if engine is None else 8)  # the option as given, read back


def test_bfloat16_states_are_attributed(tmp_path: Path) -> None:
    # guards against: bfloat16 states passed set-up and failed at fit start ("Got unsupported ScalarType BFloat16")
    states = held_out_states(8).bfloat16()
    callback = IntegratedGradientsCallback(states, every_n_steps=2, engine=IGOptions(n_steps=8), overhead=None)
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    make_trainer(tmp_path, [callback], max_steps=2).fit(model, DataLoader(dataset(), batch_size=32))
    assert callback._fit is not None and torch.equal(callback._fit.states, states.float())  # every value exact
    assert [entry["verdict"] for entry in callback.history] == ["pass"]


class _NoTraining(pl.Callback):
    def on_train_batch_start(self, *args: object) -> None:
        raise AssertionError("training started before the bad input was reported")


@pytest.mark.parametrize("given", ["states", "baseline"])
def test_states_past_the_model_dtype_range_are_refused_for_what_they_are(tmp_path: Path, given: str) -> None:
    # guards against: finite float32 states (or baseline) of 1e5 for a float16 model were refused as "states holds 4
    # NaN/Inf value(s) ...: clean or drop those states", though the states held none: the conversion made them inf
    states = held_out_states(4)
    big = states.clone()
    big[:, 2] = 1e5
    options = {"states": {"states": big}, "baseline": {"states": states, "baseline": big[0]}}[given]
    callback = IntegratedGradientsCallback(**options, every_n_steps=10_000)  # type: ignore[arg-type]
    trainer = make_trainer(tmp_path, [callback, _NoTraining()], max_steps=1, precision="16-true")
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    with pytest.raises(ValueError, match=rf"the {given} hold values past the range of the model's dtype torch.float16"):
        trainer.fit(model, DataLoader(dataset(), batch_size=32))


class NarrowBatches(TinyQNet):
    """Runs on the held-out states at once but on no wider batch than ``width`` rows (a workspace of fixed size)."""

    def __init__(self, width: int) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.width:
            raise RuntimeError(f"workspace holds {self.width} rows, got {x.shape[0]}")
        return self.body(x)


# guards against: a model that fails on the trial's batches raised its bare exception (16 rows), and one that takes
# the trial's few rows but not a run's wider batches passed set-up and stopped training at the first run (200 rows)
@pytest.mark.parametrize("width", [16, 200])
def test_a_model_that_fails_on_wider_batches_fails_at_set_up_and_is_told_what_to_pass(tmp_path: Path, width) -> None:
    callback = IntegratedGradientsCallback(held_out_states(16), every_n_steps=5, run_at_train_end=False)
    loader = DataLoader(dataset(), batch_size=16)
    with pytest.raises(ValueError, match=rf"set-up trial .*workspace holds {width} rows.*internal_batch_size"):
        make_trainer(tmp_path, [callback, _NoTraining()], max_steps=5).fit(NarrowBatches(width), loader)
    options = IGOptions(internal_batch_size=16)  # as the message says: then it runs
    callback = IntegratedGradientsCallback(held_out_states(16), every_n_steps=5, engine=options, overhead=None)
    make_trainer(tmp_path, [callback], max_steps=5).fit(NarrowBatches(width), loader)
    assert [entry["verdict"] for entry in callback.history] == ["pass"]


def test_a_model_that_takes_other_inputs_is_pointed_to_forward(tmp_path: Path) -> None:
    class Indices(TinyQNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(torch.nn.functional.one_hot(x, 4).float().sum(1))  # integer inputs only

    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=5)
    model = Indices(noisy=False, batchnorm=False, dropout=0.0)
    with pytest.raises(ValueError, match=r"failed on the held-out states.*feature shape and dtype.*forward="):
        make_trainer(tmp_path, [callback], max_steps=5).fit(model, DataLoader(dataset(), batch_size=32))


def test_a_module_without_forward_is_told_to_give_one_not_other_states(tmp_path: Path) -> None:
    class OnlyTrains(TinyQNet):  # an RL module whose Q-network is an attribute: nn.Module's forward, unimplemented
        forward = torch.nn.Module.forward

    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=5)
    model = OnlyTrains(noisy=False, batchnorm=False, dropout=0.0)
    with pytest.raises(ValueError, match=r"NotImplementedError.*Give the LightningModule a forward.*or forward=") as e:
        make_trainer(tmp_path, [callback], max_steps=5).fit(model, DataLoader(dataset(), batch_size=32))
    assert "feature shape and dtype" not in str(e.value)


def test_same_values_holds_nan_equal_at_the_same_places_and_differs_on_shape_dtype_or_a_value() -> None:
    """heldout.same_values is torch.equal with NaN equal to NaN (a model gone NaN gives NaN on its copy too: not a
    stale copy), and tells a different shape, dtype, NaN place or value apart."""
    values = torch.tensor([1.0, float("nan"), -2.0])
    assert heldout.same_values(values, values.clone())
    assert not torch.equal(values, values.clone())  # what the comparison used to be
    assert not heldout.same_values(values, torch.tensor([1.0, -2.0, float("nan")]))  # NaN elsewhere
    assert not heldout.same_values(values, torch.tensor([1.0, float("nan"), -2.5]))
    assert not heldout.same_values(values, values.double())
    assert not heldout.same_values(values, values.view(3, 1))
    assert not heldout.same_values(values, values[:2])


class Greedy(TinyQNet):
    """Returns the greedy actions (int64), not the Q-values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).argmax(1)


def test_a_model_returning_actions_is_told_to_pass_forward(tmp_path: Path) -> None:
    """A model whose forward returns int64 actions is refused at set-up with a TypeError that says to pass
    forward=, before any training."""
    callback = IntegratedGradientsCallback(held_out_states(8), every_n_steps=5)
    model = Greedy(noisy=False, batchnorm=False, dropout=0.0)
    with pytest.raises(TypeError, match=r"torch\.int64 values.*forward=callable\(pl_module, x\)"):
        make_trainer(tmp_path, [callback, _NoTraining()], max_steps=5).fit(model, DataLoader(dataset(), batch_size=32))


def test_a_state_past_the_dtype_range_in_another_ranks_share_stops_this_rank_too() -> None:
    # guards against: each rank checked its own share only, so under DDP the rank holding the bad state raised while
    # the others went on to the first collective call and waited there for it
    from types import SimpleNamespace

    from lightning_ig.attribution import IGOptions
    from lightning_ig.attribution.targets import Target
    from lightning_ig.callback.heldout import prepare_engine

    states = held_out_states(4)
    states[0, 2] = 1e5  # rank zero's share: rows 0-1 of 2 ranks
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0).half()
    rank_one = SimpleNamespace(world_size=2, global_rank=1)
    with pytest.raises(ValueError, match=r"the states hold values past the range of the model's dtype torch.float16"):
        prepare_engine(rank_one, model, Target.parse("mean"), None, states, "zeros", None, IGOptions(n_steps=8))


def _fit_counting_steps(tmp_path: Path, callback: IntegratedGradientsCallback, steps: list[int]) -> list[int]:
    class Count(pl.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            steps.append(1)

    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    make_trainer(tmp_path, [callback, Count()], max_steps=2).fit(model, DataLoader(dataset(), batch_size=32))
    return steps


def test_held_out_states_whose_runs_cannot_fit_in_memory_stop_the_fit_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig import vocabulary

    # 37 states of 4 features at n_steps="auto": 0.4 MB at its fewest 56 nodes, 3.1 MB at 512 (was: an allocator's
    # RuntimeError or the out-of-memory killer at the first run, minutes into training)
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 100_000)
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000)
    with pytest.raises(
        ValueError,
        match=r"37 states of 4 features at n_steps='auto' needs about 407\.0 KiB of memory, "
        r"more than the 97\.7 KiB available here \(swap not counted: .*\); pass fewer held-out states, or a smaller "
        r"fixed number of nodes a state: engine=IGOptions\(n_steps=N\)",
    ):
        _fit_counting_steps(tmp_path, callback, steps := [])
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000, engine=IGOptions(n_steps=64))
    with pytest.raises(ValueError, match="at n_steps=64 needs about"):  # a fixed count: every run takes all of them
        _fit_counting_steps(tmp_path, callback, steps)
    assert steps == []  # refused before training


def test_held_out_states_whose_refined_runs_may_not_fit_are_warned_of_and_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig import vocabulary

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 1_000_000)  # the 56 nodes fit, 512 for every state not
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000)
    with pytest.warns(UserWarning, match=r"at n_steps='auto', every state refined, needs about 3\.0 MiB of memory"):
        assert len(_fit_counting_steps(tmp_path, callback, [])) == 2
    assert [entry["global_step"] for entry in callback.history] == [2]


@pytest.mark.parametrize(
    ("options", "available", "said", "not_said"),
    [  # was: every message offered "engine=IGOptions(n_steps=32) (auto: max_steps=168)" and named no actions
        ({"engine": IGOptions(n_steps=16)}, 30_000, "n_steps=16 needs about", ["n_steps=32", "max_steps"]),
        ({}, 300_000, "at n_steps='auto' needs about", ["n_steps=32", "max_steps"]),  # auto's fewest: 56 nodes
        ({}, 1_000_000, "or a lower engine=IGOptions(max_steps=N)", ["n_steps=N"]),  # the warning
        ({"target": "each"}, 1_000_000, "37 states of 4 features for each of 2 actions at n_steps='auto'", []),
    ],
)
def test_the_memory_checks_fix_is_one_that_helps_and_names_the_actions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict, available: int, said: str, not_said: list[str]
) -> None:
    from lightning_ig import vocabulary

    monkeypatch.setattr(vocabulary, "available_memory", lambda: available)
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10_000, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _fit_counting_steps(tmp_path, callback, [])
            told = [str(warning.message) for warning in caught if "of memory" in str(warning.message)]
        except ValueError as error:
            told = [str(error)]
    assert len(told) == 1 and said in told[0], told
    assert not any(words in told[0] for words in not_said), told[0]


def test_the_memory_check_counts_every_process_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    # was: under CPU DDP each rank checked its own share against all the memory available, so 2 ranks on one machine
    # passed with 19 and 18 states where only one share fits, and the out-of-memory killer ended the fit
    from types import SimpleNamespace

    from lightning_ig import vocabulary
    from lightning_ig.attribution.targets import Target
    from lightning_ig.callback.heldout import prepare_engine

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 300_000)  # 19 states' 56 nodes: 214,016 bytes
    model, states, fixed = TinyQNet(noisy=False, batchnorm=False, dropout=0.0), held_out_states(), IGOptions(n_steps=56)
    trainer = SimpleNamespace(world_size=2, global_rank=0, num_devices=1)  # 2 machines of one process each: it fits
    prepare_engine(trainer, model, Target.parse("mean"), None, states, "zeros", None, fixed)
    trainer = SimpleNamespace(world_size=2, global_rank=0, num_devices=2)  # 2 processes on this machine
    with pytest.raises(
        ValueError,
        match=r"IG of 19 states of 4 features at n_steps=56 times this machine's 2 processes needs about 418\.0 KiB",
    ):
        prepare_engine(trainer, model, Target.parse("mean"), None, states, "zeros", None, fixed)
