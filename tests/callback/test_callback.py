"""Tests for IntegratedGradientsCallback on the CPU: what it logs, that it changes nothing, resume, bad input."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import pickle
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from safetensors.torch import save_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.models.noise import noise_disabled
from lightning_ig.run.statistics import spearman, topk_jaccard
from lightning_ig.views import ViewOptions
from lightning_ig.views.loggers.worker import PictureWriter
from lightning_ig.views.report import load_schema
from tests.support.tiny import FEATURES, TinyQNet, dataset, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled, eps
from tests.support.trust import REAL_CPU_SECONDS

SCALAR_TAGS = [
    "ig/completeness/worst_attribution_error",
    "ig/completeness/worst_mass_relative_error",
    "ig/completeness/mean_abs_error",
    "ig/concentration/top1pct_share",
    *[f"ig/mean_abs/{name}" for name in FEATURES],
    *[f"ig/mean_signed/{name}" for name in FEATURES],
    "ig/time_ms",
]
# Cards that carry nothing in this run (issue 20 item 7): counts never non-zero, and with 4 features the top-10%
# concentration is the top-1% one.
NOT_LOGGED = [
    "ig/completeness/worst_relative_error",  # the old ratio: in the JSON report only
    "ig/completeness/non_finite_states",
    "ig/completeness/degenerate_states",
    "ig/concentration/top10pct_share",
]


def loader(shuffle: bool = True) -> DataLoader:
    return DataLoader(dataset(), batch_size=16, shuffle=shuffle)


def direct_ig(model: TinyQNet, states: torch.Tensor, **options: Any):
    """IG computed without the callback: the model as the callback sees it (eval, noise off)."""
    was_training = model.training
    model.eval()
    try:
        with noise_disabled(model):
            return integrated_gradients(model, states, **options)
    finally:
        model.train(was_training)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run with the callback, a TensorBoard and a CSV logger; shared by several tests."""
    root = tmp_path_factory.mktemp("logged")
    pl.seed_everything(0)
    model = TinyQNet()
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        every_n_steps=10,
        feature_names=FEATURES,
        report_dir=root / "reports",
        engine=IGOptions(n_steps=16),
        views=ViewOptions(top_k=3, figure_every_n_runs=1),
    )
    tensorboard = TensorBoardLogger(root, name="tb")
    csv_logger = CSVLogger(root, name="csv")
    trainer = make_trainer(root, [callback], max_steps=30, logger=[tensorboard, csv_logger])
    trainer.fit(model, loader())
    checkpoint = root / "final.ckpt"
    trainer.save_checkpoint(checkpoint)
    accumulator = EventAccumulator(
        tensorboard.log_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0}
    )
    accumulator.Reload()
    return {
        "root": root,
        "callback": callback,
        "states": states,
        "checkpoint": checkpoint,
        "events": accumulator,
        "csv": Path(csv_logger.log_dir) / "metrics.csv",
    }


def test_every_tag_is_in_the_event_files(logged_run):
    events = logged_run["events"]
    tags = events.Tags()
    assert set(SCALAR_TAGS) <= set(tags["scalars"])
    assert not set(NOT_LOGGED) & set(tags["scalars"])
    assert {f"ig/attributions/{name}" for name in FEATURES} <= set(tags["histograms"])
    assert set(tags["images"]) == {"ig/0_verdict", "ig/1_over_training"}  # a flat state vector has no saliency
    assert "ig/report/text_summary" in tags["tensors"]  # SummaryWriter.add_text("ig/report")
    assert "custom_scalars__config__" not in tags["tensors"]  # Time Series, filtered to ig/, is the page
    # runs at steps 10, 20, 30 (the train-end run is skipped: step 30 already ran)
    assert [event.step for event in events.Scalars("ig/mean_abs/pole_theta")] == [10, 20, 30]
    # figures at every run (figure_every_n_runs=1), and they are real pictures at Time Series' size
    assert [event.step for event in events.Images("ig/1_over_training")] == [10, 20, 30]
    verdict = events.Images("ig/0_verdict")[-1]
    assert (verdict.width, verdict.height) == (320, 215)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "rank  feature" in text and "The attributions add up" in text and "Drift" in text


def test_logged_values_equal_ig_on_the_checkpoint(logged_run):
    model = TinyQNet.load_from_checkpoint(logged_run["checkpoint"])
    result = direct_ig(model, logged_run["states"], target="mean", n_steps=16)
    attributions = result.attributions.double()
    events = logged_run["events"]
    # The callback and this direct run compute the same float32 IG on the same weights; TensorBoard keeps
    # float32 scalars. Bounds: float32 roundings of the numbers involved (mean |attr| for the means).
    scale = float(attributions.abs().mean(0).max())
    logged_abs = [events.Scalars(f"ig/mean_abs/{name}")[-1] for name in FEATURES]
    assert [event.step for event in logged_abs] == [30] * 4
    assert_close_scaled([event.value for event in logged_abs], attributions.abs().mean(0), ulps=16, scale=scale)
    logged_signed = [events.Scalars(f"ig/mean_signed/{name}")[-1].value for name in FEATURES]
    assert_close_scaled(logged_signed, attributions.mean(0), ulps=16, scale=scale)
    # the JSON report holds the same numbers at full precision
    report = json.loads((logged_run["root"] / "reports" / "ig_report_step=00000030.json").read_text())
    worst = report["completeness"]["worst_relative_error"]
    # the worst relative error is itself rounding-sized: compare it as delta's rounding over |F(x) - F(b)|
    difference = (result.f_input - result.f_baseline).double().abs()
    bound = 64 * eps(torch.float32) * float(((attributions.sum(1).abs() + difference) / difference).max())
    assert abs(worst - result.worst_relative_error) <= bound + eps(torch.float32) * result.worst_relative_error
    assert_close_scaled(
        [feature["mean_abs"] for feature in report["features"]], attributions.abs().mean(0), ulps=16, scale=scale
    )
    sums = [state["sum_attributions"] for state in report["completeness"]["per_state"]]
    assert_close_scaled(sums, attributions.sum(1), ulps=16, scale=float(attributions.abs().sum(1).max()))
    # histograms hold every state's attribution
    histogram = events.Histograms("ig/attributions/pole_theta")[-1].histogram_value
    assert histogram.num == len(logged_run["states"])
    assert_close_scaled([histogram.min], [attributions[:, 2].min().item()], ulps=16, scale=scale)


def test_drift_scalars_match_the_history(logged_run):
    history = logged_run["callback"].history
    assert [entry["global_step"] for entry in history] == [10, 20, 30]
    events = logged_run["events"]
    expected_prev = spearman(history[2]["mean_abs"], history[1]["mean_abs"])
    expected_first = spearman(history[2]["mean_abs"], history[0]["mean_abs"])
    expected_jaccard = topk_jaccard(history[2]["mean_abs"], history[1]["mean_abs"], 3)
    logged = set(events.Tags()["scalars"])
    for name, expected in (("spearman_prev", expected_prev), ("spearman_first", expected_first)):
        if f"ig/drift/{name}" in logged:
            assert events.Scalars(f"ig/drift/{name}")[-1].value == pytest.approx(expected, rel=eps(torch.float32))
        else:  # a ranking that never moved is a flat line at 1: no card until it moves
            assert expected == 1.0
    if "ig/drift/topk_jaccard_prev" in logged:
        last = events.Scalars("ig/drift/topk_jaccard_prev")[-1].value
        assert last == pytest.approx(expected_jaccard, rel=eps(torch.float32))
    else:
        assert expected_jaccard == 1.0


def test_reports_are_schema_v1_and_csv_logger_gets_the_scalars(logged_run):
    reports = sorted((logged_run["root"] / "reports").glob("*.json"))
    assert [path.name for path in reports] == [f"ig_report_step={step:08d}.json" for step in (10, 20, 30)]
    schema = load_schema()
    for path in reports:
        document = json.loads(path.read_text())
        jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
        assert document["num_states"] == 37 and document["state_dim"] == 4 and document["num_steps"] == 16
        assert [feature["name"] for feature in document["features"]] == FEATURES
        assert len(document["top_10_by_mean_abs"]) == 3
    with open(logged_run["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    column = "ig/mean_abs/pole_theta"
    values = [(int(row["step"]), float(row[column])) for row in rows if row.get(column)]
    tb_values = [(event.step, event.value) for event in logged_run["events"].Scalars(column)]
    assert [step for step, _ in values] == [10, 20, 30]
    np.testing.assert_allclose([v for _, v in values], [v for _, v in tb_values], rtol=eps(torch.float32))


class _Recorder(Callback):
    """Records the gradients at the end of each training batch, to compare before / after the IG callback."""

    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor | None]] = []
        self.grad_objects: list[list[int | None]] = []
        self.modes: list[list[bool]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        params = list(pl_module.parameters())
        self.grads.append([None if p.grad is None else p.grad.clone() for p in params])
        self.grad_objects.append([None if p.grad is None else id(p.grad) for p in params])
        self.modes.append([module.training for module in pl_module.modules()])


def _train(tmp_path: Path, with_callback: bool, recorders: bool = False) -> tuple[TinyQNet, pl.Trainer, list]:
    pl.seed_everything(123)
    model = TinyQNet()
    callbacks: list[Callback] = []
    before, after = _Recorder(), _Recorder()
    if recorders:
        callbacks.append(before)
    if with_callback:
        callbacks.append(
            IntegratedGradientsCallback(
                held_out_states(),
                every_n_steps=3,
                engine=IGOptions(n_steps=8),
                views=ViewOptions(figure_every_n_runs=None),
            )
        )
    if recorders:
        callbacks.append(after)
    trainer = make_trainer(tmp_path, callbacks, max_steps=12)
    trainer.fit(model, loader(shuffle=True))
    return model, trainer, [before, after]


def test_training_is_bit_identical_with_and_without_the_callback(tmp_path):
    without, trainer_without, _ = _train(tmp_path / "a", with_callback=False)
    with_ig, trainer_with, (before, after) = _train(tmp_path / "b", with_callback=True, recorders=True)
    assert trainer_with.callbacks[1].history, "the callback never ran"
    for (name, a), (_, b) in zip(without.state_dict().items(), with_ig.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs"  # weights, BatchNorm statistics, noise buffers
    optimizer_a = trainer_without.optimizers[0].state_dict()
    optimizer_b = trainer_with.optimizers[0].state_dict()
    assert optimizer_a["param_groups"] == optimizer_b["param_groups"]
    for key, state in optimizer_a["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(optimizer_b["state"][key][name])), name
    # .grad (values and tensor objects) and every module's mode as they were before the callback ran
    assert len(before.grads) == len(after.grads) == 12
    for grads_before, grads_after in zip(before.grads, after.grads):
        for g_before, g_after in zip(grads_before, grads_after):
            assert (g_before is None and g_after is None) or torch.equal(g_before, g_after)
    assert before.grad_objects == after.grad_objects
    assert before.modes == after.modes and all(all(mode) for mode in after.modes)


def test_a_states_callable_that_samples_leaves_training_bit_identical(tmp_path):
    # guards against: the states callable called at set-up outside the kept generators, so one that samples (a
    # replay buffer's rows, with torch, numpy or random) shifted the shuffle and the noise draws of all training
    import random

    def sampled(trainer, pl_module):
        rows = torch.randint(0, 256, (9,)).tolist() + list(np.random.randint(0, 256, 2)) + [random.randrange(256)]
        return dataset().tensors[0][rows]

    weights, generators = [], []
    for callbacks in ([], [IntegratedGradientsCallback(sampled, every_n_steps=3, engine=IGOptions(n_steps=8))]):
        pl.seed_everything(123)
        model = TinyQNet()  # dropout and a NoisyLinear draw from torch's generator in every step
        make_trainer(tmp_path, callbacks, max_steps=6).fit(model, loader(shuffle=True))
        weights.append(model.state_dict())
        generators.append((torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()))
    assert callbacks[0].history, "the callback never ran"
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), f"{name} differs"
    (torch_a, numpy_a, python_a), (torch_b, numpy_b, python_b) = generators
    assert torch.equal(torch_a, torch_b) and np.array_equal(numpy_a, numpy_b) and python_a == python_b


class _Body(torch.nn.Module):  # its own forward: dynamo's cache of it is this test's alone
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _CompiledQNet(TinyQNet):
    def __init__(self, backend: Any) -> None:
        super().__init__(noisy=False)
        self.body = torch.compile(_Body(), backend=backend)  # what training and the runs call

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self(batch[0]), batch[1])


@pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="torch < 2.6 has no compiler stances")
def test_a_compiled_model_is_attributed_eagerly_and_its_compiled_graphs_are_trainings_alone(tmp_path):
    # guards against: a torch.compile'd model called by IG as it was, so the runs' forwards (eval mode, without
    # gradients, other batch sizes) recompiled it, up to torch's limit of 8 graphs, after which the fit's own new
    # graphs (validation, the last short batch) ran uncompiled; and each compile (seconds on a CPU) was the run's cost
    graphs: list[torch.fx.GraphModule] = []

    def backend(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(graph)
        return graph.forward

    counts = []
    for callbacks in (
        [],
        [IntegratedGradientsCallback(held_out_states(), every_n_steps=2, engine=IGOptions(n_steps=8))],
    ):
        torch.compiler.reset()
        graphs.clear()
        pl.seed_everything(0)
        make_trainer(tmp_path, callbacks, max_steps=4).fit(_CompiledQNet(backend), loader(shuffle=False))
        counts.append(len(graphs))
    torch.compiler.reset()
    assert callbacks[0].history, "the callback never ran"
    assert counts[1] == counts[0] >= 1  # training's graphs only


def test_run_leaves_random_generators_and_works_under_inference_mode(tmp_path):
    import random

    pl.seed_everything(7)
    model = TinyQNet()
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=5, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=5)
    trainer.fit(model, loader())
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    with torch.inference_mode():  # as in a validation hook of Trainer(inference_mode=True)
        callback._run(trainer, model, final=False)
    assert torch.equal(states[0], torch.get_rng_state())
    assert np.array_equal(states[1], np.random.get_state()[1])
    assert states[2] == random.getstate()
    assert len(callback.history) == 2  # step 5 (cadence; no train-end run at the same step) + the manual run
    assert callback.history[-1]["mean_abs"] == callback.history[-2]["mean_abs"]  # same weights, same IG


class _SignedSqrtQNet(TinyQNet):
    """Signed square-root feature scaling: its gradient is NaN at a zero feature, as at the zeros baseline."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.anomaly_mode: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(torch.sign(x) * x.abs().sqrt())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.anomaly_mode.append(torch.is_anomaly_enabled())
        return super().training_step(batch, batch_idx)


def test_anomaly_detection_is_trainings_and_a_nan_gradient_at_the_baseline_does_not_stop_the_fit(tmp_path):
    """Trainer(detect_anomaly=True): the runs' backward passes were made in training's anomaly mode, so a model whose
    gradient is NaN at the zeros baseline (a path end, whose gradient IG drops) stopped the fit with "Function
    'SqrtBackward0' returned nan values" at the first run, though training alone and IG's numbers are finite."""
    pl.seed_everything(0)
    model = _SignedSqrtQNet()
    callback = IntegratedGradientsCallback(
        held_out_states(8), every_n_steps=4, overhead=None, engine=IGOptions(n_steps=4)
    )
    make_trainer(tmp_path, [callback], max_steps=8, detect_anomaly=True).fit(model, loader())
    assert [entry["global_step"] for entry in callback.history] == [4, 8]
    assert all(math.isfinite(value) for entry in callback.history for value in entry["mean_abs"])
    assert model.anomaly_mode == [True] * 8 and not torch.is_anomaly_enabled()  # training's own, as it set it


def test_resume_keeps_the_history(tmp_path):
    pl.seed_everything(0)
    first = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=10, feature_names=FEATURES, engine=IGOptions(n_steps=8)
    )
    trainer = make_trainer(tmp_path, [first], max_steps=20)
    trainer.fit(TinyQNet(), loader())
    checkpoint = tmp_path / "half.ckpt"
    trainer.save_checkpoint(checkpoint)
    assert [entry["global_step"] for entry in first.history] == [10, 20]

    resumed = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=10, feature_names=FEATURES, engine=IGOptions(n_steps=8)
    )
    logger = TensorBoardLogger(tmp_path, name="resumed")
    trainer = make_trainer(tmp_path, [resumed], max_steps=40, logger=logger)
    trainer.fit(TinyQNet(), loader(), ckpt_path=checkpoint)
    assert [entry["global_step"] for entry in resumed.history] == [10, 20, 30, 40]
    assert resumed.history[:2] == first.history
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    first_drift = {event.step: event.value for event in events.Scalars("ig/drift/spearman_first")}
    assert sorted(first_drift) == [30, 40]  # the first run after resuming already has drift
    expected = spearman(resumed.history[2]["mean_abs"], first.history[0]["mean_abs"])
    assert first_drift[30] == pytest.approx(expected, rel=eps(torch.float32))


def test_a_resume_at_another_cadence_keeps_the_history(tmp_path):
    # guards against: the cadence in the checkpoint's key, so that a resume with every_n_steps changed started afresh
    pl.seed_everything(0)
    first = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, engine=IGOptions(n_steps=8))
    trainer = make_trainer(tmp_path, [first], max_steps=20)
    trainer.fit(TinyQNet(), loader())
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    resumed = IntegratedGradientsCallback(held_out_states(), every_n_steps=5, engine=IGOptions(n_steps=8))
    assert resumed.state_key == first.state_key
    trainer = make_trainer(tmp_path, [resumed], max_steps=30)
    trainer.fit(TinyQNet(), loader(), ckpt_path=tmp_path / "half.ckpt")
    assert [entry["global_step"] for entry in resumed.history] == [10, 20, 25, 30]
    assert resumed.history[:2] == first.history
    other_target = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, target=1)
    assert other_target.state_key != first.state_key  # drift across two targets would mean nothing


@pytest.mark.parametrize(
    ("changed", "differ"),
    [
        ({"feature_names": FEATURES[::-1]}, "names"),
        ({"states": held_out_states(seed=7)}, "values"),
        ({"states": held_out_states(n=20)}, "shape and values"),
    ],
)
def test_a_resume_on_other_features_or_states_starts_a_new_history(tmp_path, changed, differ):
    # guards against: the history kept across a resume with other feature names or held-out states of the same count,
    # so that the first run's drift compared unlike features (or states) by position, silently
    pl.seed_everything(0)
    options: dict[str, Any] = {"every_n_steps": 10, "feature_names": FEATURES, "engine": IGOptions(n_steps=8)}
    first = IntegratedGradientsCallback(held_out_states(), **options)
    trainer = make_trainer(tmp_path, [first], max_steps=20)
    trainer.fit(TinyQNet(), loader())
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    resumed = IntegratedGradientsCallback(**{"states": held_out_states(), **options, **changed})
    logger = TensorBoardLogger(tmp_path, name="resumed")
    trainer = make_trainer(tmp_path, [resumed], max_steps=40, logger=logger)
    with pytest.warns(UserWarning, match=rf"the restored history is of other .* \(their {differ} differ") as seen:
        trainer.fit(TinyQNet(), loader(), ckpt_path=tmp_path / "half.ckpt")
    assert sum("restored history" in str(warning.message) for warning in seen) == 1
    assert [entry["global_step"] for entry in resumed.history] == [30, 40]
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    first_drift = {event.step: event.value for event in events.Scalars("ig/drift/spearman_first")}
    assert sorted(first_drift) == [40]  # the first run after resuming has none: it is the new history's first
    expected = spearman(resumed.history[1]["mean_abs"], resumed.history[0]["mean_abs"])
    assert first_drift[40] == pytest.approx(expected, rel=eps(torch.float32))


def test_a_new_history_on_resume_starts_its_trust_check_schedule_afresh(tmp_path):
    # guards against: the checkpoint's check schedule (run indices of the replaced history) kept for the new one, so
    # that its first run was not a first run: under a budget that binds it was deferred or made without the checks
    # (a fit's first run makes them all), and the budget's starved rule, counted from the old indices, never stepped in
    pl.seed_everything(0)
    options: dict[str, Any] = {"every_n_steps": 2, "engine": IGOptions(n_steps=8), "overhead": 1.0}
    first = IntegratedGradientsCallback(held_out_states(), **options)
    trainer = make_trainer(tmp_path, [first], max_steps=20)
    trainer.fit(TinyQNet(), loader())
    saved = first.state_dict()
    assert saved["budget"]["last_checks"] == dict.fromkeys(["sanity", "deletion", "stability"], 9)
    for states, kept in ((held_out_states(), True), (held_out_states(seed=7), False)):
        resumed = IntegratedGradientsCallback(states, **options)
        resumed.setup(trainer, TinyQNet(), "fit")  # as Lightning: set-up, then the checkpoint's callback state
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            resumed.load_state_dict(saved)
        assert any("restored history is of other" in str(w.message) for w in seen) != kept
        assert len(resumed.history) == (10 if kept else 0)
        assert resumed._restored["last_checks"] == (saved["budget"]["last_checks"] if kept else {})
        assert resumed._restored["check_costs"] == saved["budget"]["check_costs"]  # the measure stays


class _TwoOptimizers(TinyQNet):
    """Manual optimisation stepping two optimizers per batch (the hidden layer's and the head's, as an actor-critic
    steps two): Lightning's global_step moves by 2 a batch."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.automatic_optimization = False

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        for optimizer in self.optimizers():
            optimizer.zero_grad()
            self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
            optimizer.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.body[0].parameters(), lr=0.01),
            torch.optim.SGD(self.body[-1].parameters(), lr=0.01),
        ]


def test_every_n_steps_runs_at_each_multiple_crossed_when_a_batch_moves_two_steps(tmp_path):
    """With two optimizer steps per batch (global_step 2, 4, 6, ...) and every_n_steps=5, a run lands at the first
    batch end at or after each multiple of 5: 6, 10, 16, 20 (it used to run only where the step was a multiple, 10
    and 20, half the runs asked for)."""
    callback = IntegratedGradientsCallback(
        held_out_states(8), every_n_steps=5, overhead=None, run_at_train_end=False, engine=IGOptions(n_steps=4)
    )
    make_trainer(tmp_path, [callback], max_steps=20).fit(_TwoOptimizers(), loader())
    assert [entry["global_step"] for entry in callback.history] == [6, 10, 16, 20]


class _ManualSteps(TinyQNet):
    """Manual optimisation with ``max(steps)`` optimizers, ``steps[batch_idx % len(steps)]`` of them stepped at a
    batch (0: none, as a GAN's generator skips batches): Lightning's global_step moves by that many."""

    def __init__(self, steps: tuple[int, ...]) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.automatic_optimization = False
        self.steps = steps

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y, optimizers = *batch, self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]  # one comes alone
        for optimizer in optimizers[: self.steps[batch_idx % len(self.steps)]]:
            optimizer.zero_grad()
            self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
            optimizer.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD(self.parameters(), lr=0.01) for _ in range(max(self.steps))]


def _runs_made(trainer: pl.Trainer, model: pl.LightningModule) -> list[tuple[int, bool]]:
    """Fit ``model``: each run of the trainer's callback as ``(step, final)``, in the order made."""
    runs: list[tuple[int, bool]] = []
    finish = IntegratedGradientsCallback._finish

    def recording(self, pending, **kwargs):
        runs.append((pending.step, pending.final))
        finish(self, pending, **kwargs)

    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.setattr(IntegratedGradientsCallback, "_finish", recording)
        trainer.fit(model, loader())
    return runs


@pytest.mark.parametrize("steps", [(1,), (2,), (3,), (0, 3)])
def test_under_manual_optimisation_the_fits_last_run_is_its_final_one(tmp_path, steps):
    """Under manual optimisation global_step counts every optimizer's steps while Lightning's estimated stepping
    batches count batches: the callback took the run at the step that estimate names (the midpoint with two
    optimizers) as the final one, and with three (or steps skipped) made none. Only the last run is final."""
    callback = IntegratedGradientsCallback(held_out_states(8), every_n_steps=8, engine=IGOptions(n_steps=4))
    trainer = make_trainer(tmp_path, [callback], max_steps=-1, max_epochs=2)
    runs = _runs_made(trainer, _ManualSteps(steps))
    assert trainer.global_step == 2 * len(loader()) * sum(steps) // len(steps)
    assert len(runs) == trainer.global_step // 8 and runs[-1] == (trainer.global_step, True)  # a run a multiple
    assert not any(final for _, final in runs[:-1])


def test_a_multiple_crossed_by_the_fits_first_batch_gets_its_run(tmp_path):
    """Three optimizer steps a batch (global_step 3, 6, 9) and every_n_steps=2: the first batch crosses 2 and runs (the
    cadence used to start from the step before the first batch end, as if every batch stepped once: no run at 3)."""
    callback = IntegratedGradientsCallback(
        held_out_states(8), every_n_steps=2, overhead=None, run_at_train_end=False, engine=IGOptions(n_steps=4)
    )
    make_trainer(tmp_path, [callback], max_steps=9).fit(_ManualSteps((3,)), loader())
    assert [entry["global_step"] for entry in callback.history] == [3, 6, 9]


def test_the_run_at_the_last_epochs_end_is_the_final_one(tmp_path):
    """every_n_epochs: the run at the last epoch's end is the fit's last (the train-end run at its step is skipped);
    it was made as any other, not full, with the checks the budget left for later still waiting."""
    callback = IntegratedGradientsCallback(
        held_out_states(8), every_n_steps=None, every_n_epochs=1, engine=IGOptions(n_steps=4)
    )
    runs = _runs_made(make_trainer(tmp_path, [callback], max_steps=-1, max_epochs=2), TinyQNet())
    assert runs == [(16, False), (32, True)]


def test_the_train_end_run_is_dated_by_the_epoch_it_trained_in_not_the_one_after(tmp_path):
    """A fit of 10 steps inside its first epoch (16 batches): the run at training's end said epoch 1 (Lightning's
    current_epoch counts the ended epoch by then), its checkpoint epoch=0-step=10, and a run at the same step made at
    the batch end (every_n_steps=5) epoch 0."""
    runs = {}
    for every in (3, 5):
        callback = IntegratedGradientsCallback(
            held_out_states(8), every_n_steps=every, overhead=None, report_dir=tmp_path / f"every{every}"
        )
        make_trainer(tmp_path, [callback], max_steps=10).fit(TinyQNet(), loader())
        report = json.loads((tmp_path / f"every{every}" / "ig_report_step=00000010.json").read_text())
        runs[every] = [(entry["global_step"], entry["epoch"]) for entry in callback.history], report["epoch"]
    assert runs == {3: ([(3, 0), (6, 0), (9, 0), (10, 0)], 0), 5: ([(5, 0), (10, 0)], 0)}


def test_runs_after_a_resume_from_an_epochs_last_batch_are_dated_by_the_epoch_they_trained_in(tmp_path):
    """A checkpoint saved at epoch 0's last batch end (step 16 of 16): resumed, Lightning's epoch counter `ready`
    stayed a count behind, so the runs in epoch 1 (steps 20 and 22, the latter at training's end) said epoch 0."""
    pl.seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=16)
    first = IntegratedGradientsCallback(held_out_states(8), every_n_steps=5, overhead=None)
    make_trainer(tmp_path, [first, saver], max_steps=16, enable_checkpointing=True).fit(TinyQNet(), loader())
    resumed = IntegratedGradientsCallback(held_out_states(8), every_n_steps=5, overhead=None)
    checkpoint = tmp_path / "checkpoints" / "epoch=0-step=16.ckpt"
    make_trainer(tmp_path, [resumed], max_steps=22).fit(TinyQNet(), loader(), ckpt_path=checkpoint)
    runs = [(entry["global_step"], entry["epoch"]) for entry in resumed.history]
    assert runs == [(5, 0), (10, 0), (15, 0), (20, 1), (22, 1)]


@pytest.mark.parametrize("earlier", ["{'name': None, 'target': 'mean', ", "{'target': 'mean', "])
def test_a_resume_from_an_earlier_versions_checkpoint_keeps_the_history(tmp_path, earlier):
    # guards against: the state kept under an earlier version's state_key (the cadences in it, once no name) never
    # restored: an upgrade mid-training started the history afresh, with only Lightning's "add the callbacks" warning
    first = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, engine=IGOptions(n_steps=8))
    trainer = make_trainer(tmp_path, [first], max_steps=20)
    trainer.fit(TinyQNet(), loader())
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    checkpoint = torch.load(tmp_path / "half.ckpt", weights_only=False)
    state = checkpoint["callbacks"].pop(first.state_key)
    cadences = "'every_n_steps': 10, 'every_n_epochs': None}"
    other = f"IntegratedGradientsCallback{{'name': 'other', 'target': 'mean', {cadences}"
    checkpoint["callbacks"][other] = {**state, "history": []}  # another callback's: not taken
    checkpoint["callbacks"][f"IntegratedGradientsCallback{earlier}{cadences}"] = state
    torch.save(checkpoint, tmp_path / "earlier.ckpt")
    resumed = IntegratedGradientsCallback(held_out_states(), every_n_steps=5, engine=IGOptions(n_steps=8))
    trainer = make_trainer(tmp_path, [resumed], max_steps=30)
    trainer.fit(TinyQNet(), loader(), ckpt_path=tmp_path / "earlier.ckpt")
    assert [entry["global_step"] for entry in resumed.history] == [10, 20, 25, 30]
    assert resumed.history[:2] == first.history


def test_a_callback_pickles_after_a_fit_and_fits_again(tmp_path):
    # guards against: the fit's engine and hooks (a closure over the trainer) in the pickle (ddp_spawn, torch.save)
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, engine=IGOptions(n_steps=8))
    make_trainer(tmp_path, [callback], max_steps=20).fit(TinyQNet(), loader())
    again = pickle.loads(pickle.dumps(callback))
    assert again.history == callback.history and again.every_n_steps == 10 and again._fit is None
    make_trainer(tmp_path / "again", [again], max_steps=20).fit(TinyQNet(), loader())
    assert again._fit is not None and [entry["global_step"] for entry in again.history] == [10, 20]  # a fit of its own


def test_a_fit_continued_on_its_trainer_is_warned_only_of_reports_it_would_replace(tmp_path):
    reports = tmp_path / "reports"
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, report_dir=reports, overhead=None)
    trainer = make_trainer(tmp_path, [callback], max_steps=10)
    trainer.fit(TinyQNet(), loader())
    trainer.fit_loop.epoch_loop.max_steps = 20  # the same trainer, trained on: its reports start past step 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(trainer.lightning_module, loader())
    assert not [warning for warning in caught if "earlier fit" in str(warning.message)]
    (reports / "ig_report_step=00000030.json").write_text("{}")  # one this fit would replace
    trainer.fit_loop.epoch_loop.max_steps = 30
    with pytest.warns(UserWarning, match=r"holds 1 report\(s\) of an earlier fit past step 20"):
        trainer.fit(trainer.lightning_module, loader())


def test_a_fit_continued_on_its_trainer_continues_the_history(tmp_path):
    # guards against: every trainer.fit starting a new history, so that a second call with nothing left to do emptied
    # callback.history and a continued fit's drift and cards started again from its own first run
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=5, engine=IGOptions(n_steps=8), overhead=None
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=10)
    trainer.fit(TinyQNet(), loader())
    first = [dict(entry) for entry in callback.history]
    trainer.fit(trainer.lightning_module, loader())  # nothing left to do
    assert callback.history == first and [entry["global_step"] for entry in first] == [5, 10]
    trainer.fit_loop.epoch_loop.max_steps = 20
    trainer.fit(trainer.lightning_module, loader())
    assert callback.history[:2] == first and [entry["global_step"] for entry in callback.history] == [5, 10, 15, 20]
    again = make_trainer(tmp_path / "again", [callback], max_steps=5)  # another trainer: a new fit, a new history
    again.fit(TinyQNet(), loader())
    assert [entry["global_step"] for entry in callback.history] == [5]


def test_resuming_into_the_same_report_dir_does_not_warn_of_an_earlier_fit(tmp_path):
    reports = tmp_path / "reports"
    first = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, report_dir=reports, overhead=None)
    trainer = make_trainer(tmp_path, [first], max_steps=10)
    trainer.fit(TinyQNet(), loader())
    checkpoint = tmp_path / "half.ckpt"
    trainer.save_checkpoint(checkpoint)

    resumed = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, report_dir=reports, overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [resumed], max_steps=20).fit(TinyQNet(), loader(), ckpt_path=checkpoint)
    assert not [warning for warning in caught if "earlier fit" in str(warning.message)]  # the same fit, continued
    assert sorted(path.name for path in reports.iterdir()) == [
        "ig_report_step=00000010.json",
        "ig_report_step=00000020.json",
    ]


def test_a_tensorboard_logger_prefix_is_kept_on_the_scalars(tmp_path):
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=5, engine=IGOptions(n_steps=4), views=ViewOptions(figure_every_n_runs=None)
    )
    logger = TensorBoardLogger(tmp_path, name="prefixed", prefix="run")
    make_trainer(tmp_path, [callback], max_steps=10, logger=logger).fit(TinyQNet(), loader())
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    assert [event.step for event in events.Scalars("run-ig/time_ms")] == [5, 10]
    assert not [tag for tag in events.Tags()["scalars"] if tag.startswith("ig/")]


def test_state_keys_let_two_callbacks_coexist():
    a = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, target="mean")
    b = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, target=1)
    assert a.state_key != b.state_key
    assert a.state_key == f"IntegratedGradientsCallback{a.options.identity()!r}"  # Lightning's documented form


class _CountsBatchStarts(IntegratedGradientsCallback):
    def on_train_batch_start(self, *args: Any) -> None:
        self._starts = getattr(self, "_starts", 0) + 1


def test_the_step_hooks_left_as_no_ops_are_not_callable_and_a_subclass_keeps_its_own(tmp_path):
    # the trainer calls a callback's hook only where it is callable: the no-ops cost nothing at each step
    plain = IntegratedGradientsCallback(held_out_states(), every_n_steps=4, overhead=None)
    counting = _CountsBatchStarts(held_out_states(), every_n_steps=4, overhead=None, name="counting")
    for hook in ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step"):
        assert not callable(getattr(plain, hook)), hook
    assert callable(plain.on_train_batch_end) and callable(counting.on_train_batch_start)
    make_trainer(tmp_path, [plain, counting], max_steps=6).fit(TinyQNet(), DataLoader(dataset(), batch_size=16))
    assert counting._starts == 6  # the subclass's own hook, at every step
    assert len(plain.history) == len(counting.history) == 2  # steps 4 and the end


def test_no_logger_still_writes_reports_and_says_so(tmp_path, caplog):
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=4, engine=IGOptions(n_steps=4))
    trainer = make_trainer(tmp_path, [callback], max_steps=6, logger=False)
    with caplog.at_level(logging.INFO):
        trainer.fit(TinyQNet(), loader())
    messages = [record.getMessage() for record in caplog.records if "no logger" in record.getMessage()]
    assert len(messages) == 1 and "ig_reports" in messages[0]
    written = sorted(path.name for path in (tmp_path / "ig_reports").glob("*.json"))
    assert written == ["ig_report_step=00000004.json", "ig_report_step=00000006.json"]  # cadence + train end


def test_fast_dev_run_runs_ig_and_says_its_numbers_go_nowhere(tmp_path, caplog):
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=1, engine=IGOptions(n_steps=4))
    trainer = make_trainer(tmp_path, [callback], max_steps=6, logger=True, fast_dev_run=True)
    with caplog.at_level(logging.INFO):
        trainer.fit(TinyQNet(), loader())
    messages = [
        record.getMessage()
        for record in caplog.records
        if "IntegratedGradientsCallback: fast_dev_run" in record.getMessage()
    ]
    assert len(messages) == 1 and "their numbers go nowhere" in messages[0]
    assert len(callback.history) == 1 and not list(tmp_path.rglob("*.json"))  # ran once, wrote nothing


def test_a_fit_shorter_than_the_cadence_without_the_final_run_says_it_made_none(tmp_path):
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=10, run_at_train_end=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=7).fit(TinyQNet(), loader())
    said = [str(w.message) for w in caught if "no run in this fit" in str(w.message)]
    assert not callback.history and len(said) == 1 and "ended at step 7" in said[0]


def test_completeness_warning_fires_once(tmp_path):
    # one left-Riemann point on a curved model: the attributions cannot add up
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=2, completeness_tol=1e-6, engine=IGOptions(n_steps=1, method="riemann_left")
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyQNet(), loader())
    completeness = [w for w in caught if "completeness error" in str(w.message)]
    assert len(callback.history) == 3
    assert len(completeness) == 1 and "completeness_tol=1e-06" in str(completeness[0].message)


def test_each_fit_of_a_sweep_says_its_trouble_though_an_earlier_fit_said_the_same_words(tmp_path):
    # guards against: a sweep's trials (a new callback and Trainer each, in one process) whose trouble read word for
    # word as an earlier trial's (a random forward "at step 2") said it in the first trial only: Python shows a
    # warning's text once per place, and the callback's every warning came from the one place
    def forward(pl_module: TinyQNet, x: torch.Tensor) -> torch.Tensor:  # random even in eval mode
        return torch.nn.functional.dropout(pl_module(x), 0.5, training=True).mean(1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default for a UserWarning: once per text and place
        for trial in range(3):
            callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=2, forward=forward, overhead=None)
            make_trainer(tmp_path / str(trial), [callback], max_steps=2).fit(TinyQNet(), loader())
    said = [str(w.message) for w in caught if "the forward gave different values on the same rows" in str(w.message)]
    assert len(said) == 3 and len(set(said)) == 1  # the same words, said in each fit


@pytest.mark.parametrize("kind", ["npy", "json", "safetensors", "callable"])
def test_states_from_files_and_callables(tmp_path, kind):
    states = held_out_states(9)
    if kind == "npy":
        source: Any = tmp_path / "states.npy"
        np.save(source, states.numpy())
    elif kind == "json":
        source = tmp_path / "states.json"
        source.write_text(json.dumps({"states": states.tolist()}))
    elif kind == "safetensors":
        source = tmp_path / "states.safetensors"
        save_file({"__states__": states}, str(source))
    else:
        source = lambda trainer, pl_module: states  # noqa: E731
    callback = IntegratedGradientsCallback(
        source, every_n_steps=3, report_dir=tmp_path / "r", engine=IGOptions(n_steps=4)
    )
    make_trainer(tmp_path, [callback], max_steps=3).fit(TinyQNet(), loader())
    report = json.loads((tmp_path / "r" / "ig_report_step=00000003.json").read_text())
    assert report["num_states"] == 9
    model_states = callback._fit.held_out
    assert torch.equal(model_states, states)


def test_a_states_file_the_readers_cannot_read_is_refused_when_the_callback_is_made(tmp_path):
    source = tmp_path / "held_out_states.pt"  # was: taken here, refused inside trainer.fit
    torch.save(held_out_states(3), source)
    with pytest.raises(ValueError, match=r"states '.*held_out_states.pt' must end in .safetensors/.npy/.json, or pass"):
        IntegratedGradientsCallback(source, every_n_steps=3)
    with open(tmp_path / "upper.NPY", "wb") as file:  # the readers take a suffix in any case
        np.save(file, held_out_states(3).numpy())
    assert IntegratedGradientsCallback(tmp_path / "upper.NPY", every_n_steps=3).states == tmp_path / "upper.NPY"


def test_targets_and_baselines(tmp_path):
    states = held_out_states(11)
    pl.seed_everything(3)
    model = TinyQNet()

    def advantage_gap(pl_module: TinyQNet, x: torch.Tensor) -> torch.Tensor:
        q = pl_module(x)
        return q[:, 1] - q[:, 0]

    cases = [
        ({"target": 1, "baseline": "zeros"}, {"target": 1, "baselines": "zeros"}),
        ({"target": "mean", "baseline": "mean"}, {"target": "mean", "baselines": states.mean(0)}),
        ({"target": "mean", "baseline": torch.full((4,), 0.5)}, {"target": "mean", "baselines": torch.full((4,), 0.5)}),
        ({"target": "mean", "baseline": 0.5}, {"target": "mean", "baselines": 0.5}),  # a number, as the engine takes
        ({"forward": advantage_gap}, {"target": None}),
    ]
    for index, (options, direct) in enumerate(cases):
        callback = IntegratedGradientsCallback(
            states, every_n_steps=100, report_dir=tmp_path / str(index), **options, engine=IGOptions(n_steps=8)
        )
        make_trainer(tmp_path, [callback], max_steps=2).fit(model, loader())
        forward = (lambda x: advantage_gap(model, x)) if "forward" in options else model
        if forward is model:
            expected = direct_ig(model, states, n_steps=8, **direct)
        else:
            expected = _direct_fn(model, forward, states)
        report = json.loads(next((tmp_path / str(index)).glob("*.json")).read_text())
        labels = ["action:1", "mean", "mean", "mean", "callable:" + advantage_gap.__qualname__]
        assert report["forward_target"] == labels[index]
        assert report["baseline"] == ["zeros", "mean", "tensor(4,)", "constant:0.5", "zeros"][index]
        scale = float(expected.attributions.double().abs().mean(0).max())
        assert_close_scaled(
            [f["mean_signed"] for f in report["features"]], expected.attributions.double().mean(0), ulps=64, scale=scale
        )
        assert_close_scaled(
            [f["mean_abs"] for f in report["features"]],
            expected.attributions.double().abs().mean(0),
            ulps=64,
            scale=scale,
        )


def _direct_fn(model: TinyQNet, forward, states: torch.Tensor):
    model.eval()
    try:
        with noise_disabled(model):
            return integrated_gradients(forward, states, n_steps=8)
    finally:
        model.train()


@pytest.mark.parametrize(
    ("every", "max_steps", "expected", "expected_heatmap"),
    [
        # runs 0..6 at steps 1..7: the verdict at runs 0, 3, 6, the shares half a cadence later (0, 1, 4)
        (3, 7, [1, 4, 7], [1, 2, 5, 7]),
        (3, 6, [1, 4, 6], [1, 2, 5, 6]),  # the last run (step 6) always gets both
        (10, 7, [1, 7], [1, 6, 7]),  # the default cadence: the first run, the end (the heatmap also at run 5)
        (None, 7, [], []),
    ],
)
def test_figure_cadence(tmp_path, every, max_steps, expected, expected_heatmap):
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=1, engine=IGOptions(n_steps=4), views=ViewOptions(figure_every_n_runs=every)
    )
    logger = TensorBoardLogger(tmp_path, name="figures")
    make_trainer(tmp_path, [callback], max_steps=max_steps, logger=logger).fit(TinyQNet(), loader())
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    images = events.Tags()["images"]
    shares = [event.step for event in events.Images("ig/1_over_training")] if expected_heatmap else []
    assert shares == expected_heatmap and (expected or "ig/0_verdict" not in images)
    # the verdict card at its cadence, and also at every run that failed or whose verdict differs from the last card's
    drawn = [event.step for event in events.Images("ig/0_verdict")] if expected else []
    states = {entry["global_step"]: (entry["verdict"], entry["trust"]) for entry in callback.history}
    failed = {
        step for step, (verdict, trust) in states.items() if verdict in ("fail", "non-finite") or trust == "failed"
    }
    assert set(expected) | (failed if expected else set()) <= set(drawn)
    for previous, step in itertools.pairwise(drawn):
        assert step in expected or step in failed or states[step] != states[previous], (step, states)


# ---------------------------------------------------------------------- bad input


def test_nan_states_fail_at_construction_and_at_setup(tmp_path):
    states = held_out_states(5)
    states[3, 2] = math.nan
    with pytest.raises(ValueError, match=r"states holds 1 NaN/Inf value\(s\), the first at index \(3, 2\)"):
        IntegratedGradientsCallback(states)
    path = tmp_path / "bad.npy"
    np.save(path, states.numpy())
    callback = IntegratedGradientsCallback(path, every_n_steps=1)
    with pytest.raises(ValueError, match=r"NaN/Inf value\(s\), the first at index \(3, 2\)"):
        make_trainer(tmp_path, [callback], max_steps=1).fit(TinyQNet(), loader())


class _NoTraining(Callback):
    def on_train_batch_start(self, *args: Any) -> None:
        raise AssertionError("training started before the bad input was reported")


@pytest.mark.parametrize(
    ("states", "options", "match"),
    [
        (torch.randn(6, 5), {}, r"model failed on the held-out states \(feature shape \(5,\)"),
        (torch.randn(6, 4), {"feature_names": ["a", "b", "c"]}, "feature_names has 3 names but there are 4 features"),
        (torch.randn(6, 4), {"feature_groups": "channels"}, "needs states with a channel dimension"),
        (torch.randn(6, 4), {"feature_groups": {"a": [0, 9]}}, "holds index 9, outside the 4 features"),
        (torch.randn(6, 4), {"group_names": ["a"]}, "group_names needs feature_groups"),
        # guards against: a third, phantom group of no feature, logged as attribution 0 every run
        (
            torch.randn(6, 4),
            {"feature_groups": {"a": [0, 1], "b": [2, 3]}, "group_names": ["a", "b", "c"]},
            "group_names has 3 names but there are 2 groups",
        ),
        (
            torch.randn(6, 3, 2, 2),
            {"feature_groups": "channels", "group_names": ["r", "g", "b", "alpha"]},
            "group_names has 4 names but there are 3 groups",
        ),
        # guards against: passed set-up and failed at the first picture, mid-training
        (
            torch.randn(6, 3, 2, 2),
            {"views": ViewOptions(saliency_channel=7)},
            r"saliency_channel=7 is out of range for 3 channels",
        ),
        (torch.randn(6, 4), {"target": 2}, r"target=2 is out of range: the model returns 2 outputs per state"),
        (torch.randn(6, 4), {"baseline": torch.zeros(3)}, r"baseline has shape \(3,\) but the states have shape"),
        (torch.randn(6, 4), {"engine": IGOptions(backend="cuda")}, "backend='cuda' needs a CUDA device"),
        (
            torch.randn(6, 4),
            {"forward": lambda module, x: (module(x) > 0).float().sum(1)},  # no gradient flows through a comparison
            "autograd",
        ),
        (
            lambda trainer, pl_module: [[1.0, 2.0]],
            {},
            "the states callable <lambda> must return a tensor",
        ),
    ],
)
def test_bad_input_fails_before_training(tmp_path, states, options, match):
    callback = IntegratedGradientsCallback(states, every_n_steps=1, **options)
    trainer = make_trainer(tmp_path, [callback, _NoTraining()], max_steps=2)
    with pytest.raises((ValueError, TypeError), match=match):
        trainer.fit(TinyQNet(), loader())


def test_a_states_callable_that_fails_says_when_it_runs(tmp_path):
    # guards against: the user's bare AttributeError for a module attribute made in setup(), after the callback's
    def states(trainer: Any, pl_module: Any) -> torch.Tensor:
        return torch.randn(6, pl_module.encoder_width)  # made in the module's setup(): not there yet

    callback = IntegratedGradientsCallback(states, every_n_steps=1)
    trainer = make_trainer(tmp_path, [callback, _NoTraining()], max_steps=2)
    with pytest.raises(
        RuntimeError, match=r"states callable .*states raised AttributeError: .*encoder_width.*before the "
    ):
        trainer.fit(TinyQNet(), loader())


def test_states_made_under_inference_mode(tmp_path):
    with torch.inference_mode():
        states = held_out_states(8) * 1.0  # an inference tensor
    callback = IntegratedGradientsCallback(states, every_n_steps=2, engine=IGOptions(n_steps=4))
    make_trainer(tmp_path, [callback], max_steps=2).fit(TinyQNet(), loader())
    assert len(callback.history) == 1


def test_forward_callable_must_return_one_value_per_state(tmp_path):
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=1, forward=lambda module, x: module(x))
    with pytest.raises(
        ValueError, match=r"must return one value per state, shape \(37,\), got \(37, 2\); pick it inside, e.g. q.max"
    ):
        make_trainer(tmp_path, [callback, _NoTraining()], max_steps=2).fit(TinyQNet(), loader())


def test_a_target_callable_selects_from_the_outputs_as_the_engine_does(tmp_path):
    def second_action(outputs):  # (N, A) -> (N,)
        return outputs[:, 1]

    by_callable = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=2, target=second_action, engine=IGOptions(n_steps=4)
    )
    by_index = IntegratedGradientsCallback(held_out_states(), every_n_steps=2, target=1, engine=IGOptions(n_steps=4))
    for callback in (by_callable, by_index):
        torch.manual_seed(0)  # the same model and batches for both
        make_trainer(tmp_path, [callback], max_steps=2).fit(TinyQNet(), loader())
    assert by_callable.history[0]["mean_abs"] == by_index.history[0]["mean_abs"]  # the same scalar attributed
    assert by_callable._fit.target.label.startswith("callable:") and by_index._fit.target.label == "action:1"


# ---------------------------------------------------------------------- figures


def _bar_rows(pixels: np.ndarray) -> list[tuple[int, int]]:
    """``(blue width, red width)`` in pixels of each bar, top to bottom, found by their colours in a drawn card."""
    from lightning_ig.views.pictures.raster import NEGATIVE, POSITIVE, rgb

    masks = {name: (pixels == np.array(rgb(code))).all(axis=-1) for name, code in (("+", POSITIVE), ("-", NEGATIVE))}
    coloured = masks["+"] | masks["-"]
    rows, bars, previous = np.flatnonzero(coloured.sum(axis=1) > 12), [], -10  # more than a glyph's ink
    for row in rows:
        if row > previous + 3:  # a new bar starts: read it on its first row
            bars.append((int(masks["+"][row].sum()), int(masks["-"][row].sum())))
        previous = row
    return bars[:-1]  # the last: the legend's swatches, below the bars


def test_the_verdict_card_draws_the_ranked_mass_to_scale_at_4_and_400_groups():
    from lightning_ig.run.host_result import Moments
    from lightning_ig.run.statistics import rank_order
    from lightning_ig.run.summary import Units
    from lightning_ig.views.pictures.cards import verdict_card
    from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH

    rng = np.random.default_rng(0)
    for units in (4, 400):
        values = rng.normal(size=(16, units)) * np.linspace(3.0, 0.1, units) + np.linspace(1.0, -1.0, units)
        positive, negative = Units("groups", [str(i) for i in range(units)], Moments.of(values)).parts
        labels = [f"group {i:03d}" for i in range(units)]
        card = verdict_card(labels, positive, negative, title=["t"], accuracy=("pass", "worst error 1e-3"))
        order = rank_order(positive + negative)[: 4 if units > 5 else units]  # four and "the other 396 groups"
        assert card.labels == tuple(labels[i] for i in order)
        assert card.pixels.dtype == np.uint8 and card.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)  # shown at 1.0x
        # one bar per unit, the largest mass on top, long in proportion, split blue (the positive part) then red
        # (the negative part): a mixture of signs shows as two colours
        drawn = np.array(_bar_rows(card.pixels), dtype=float)
        assert len(drawn) == len(order)
        pixels_per_unit = drawn[0].sum() / (positive + negative)[order[0]]
        np.testing.assert_allclose(drawn[:, 0], positive[order] * pixels_per_unit, atol=2.0)  # whole-pixel ends
        np.testing.assert_allclose(drawn[:, 1], negative[order] * pixels_per_unit, atol=2.0)


def test_the_counts_seen_non_zero_are_kept_across_a_resume():
    # a resumed fit goes on logging a count card that appeared before (no gap from the resume on)
    callback = IntegratedGradientsCallback(held_out_states())
    assert callback.state_dict()["ever_non_zero"] == []
    callback.load_state_dict(
        {"history": [], "last_run_step": 4, "ever_non_zero": ["ig/completeness/degenerate_states"]}
    )
    assert callback.state_dict()["ever_non_zero"] == ["ig/completeness/degenerate_states"]
    assert IntegratedGradientsCallback(held_out_states()).load_state_dict({"history": []}) is None  # old checkpoints


class _BusyThreadQNet(TinyQNet):
    """Training with a thread of its own that works after the callback's first run (as autograd's device thread runs
    a GPU backward, or a data thread fills a replay buffer)."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == 4:
            import threading
            import time

            def spin() -> None:
                until = time.thread_time() + 1.0
                while time.thread_time() < until:
                    pass

            worker = threading.Thread(target=spin)
            worker.start()
            worker.join()


def test_the_budget_counts_the_pictures_thread_not_trainings_own_threads(tmp_path: Path, monkeypatch) -> None:
    # guards against: every other thread's CPU beyond its rate before the first run booked to the callback, so that
    # on a GPU training's own backward (autograd's device thread) spent the budget and every run was deferred
    monkeypatch.setattr(PictureWriter, "cpu_seconds", REAL_CPU_SECONDS)  # counted, as outside the tests
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=3, views=ViewOptions(figure_every_n_runs=None, saliency_states=None)
    )
    make_trainer(tmp_path, [callback], max_steps=9).fit(_BusyThreadQNet(), DataLoader(dataset(), batch_size=16))
    assert callback._budget.extra() == 0.0  # no pictures drawn: nothing beside the hooks is the callback's
