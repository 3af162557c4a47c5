"""The callback's why-this-action targets: ``target="contrast"`` (per state ``Q(greedy) - Q(runner-up)``) and
``target="each"`` (every action's ``Q(s, a)`` in one batched run)."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.models.noise import noise_disabled
from lightning_ig.views import ViewOptions
from tests.callback.test_callback import loader
from tests.support.tags import scalar_tags
from tests.support.tiny import FEATURES, ConvQNet, TinyQNet, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled

REPO = Path(__file__).resolve().parents[2]
N_STEPS = 16


@pytest.fixture(scope="module")
def contrast_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fit with ``target="contrast"`` at ``lr=0``, runs at steps 5 and 10; the last run saw the final weights and
    batch-norm statistics (the model's BatchNorm still updates them in training mode at ``lr=0``)."""
    root = tmp_path_factory.mktemp("contrast")
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0)
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="contrast",
        every_n_steps=5,
        feature_names=FEATURES,
        engine=IGOptions(n_steps=N_STEPS),
        views=ViewOptions(figure_every_n_runs=1),
    )
    tensorboard = TensorBoardLogger(root, name="tb")
    trainer = make_trainer(root, [callback], max_steps=10, logger=tensorboard)
    trainer.fit(model, loader())
    events = EventAccumulator(tensorboard.log_dir, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    model.eval()
    with noise_disabled(model):
        result = integrated_gradients(model, states, target="contrast", n_steps=N_STEPS)
        with torch.no_grad():
            q_values = model(states).double()
    model.train()
    return {"callback": callback, "events": events, "result": result, "q_values": q_values, "states": states}


def test_contrast_is_the_greedy_margin_and_its_scalars_equal_the_engines(contrast_run):
    result, events = contrast_run["result"], contrast_run["events"]
    # The engine's pairs are the greedy and runner-up outputs at each state, its target their difference.
    expected = np.argsort(-contrast_run["q_values"].numpy(), axis=1, kind="stable")[:, :2]  # ties: the lower index
    assert np.array_equal(result.target_actions.numpy(), expected)
    assert np.array_equal(contrast_run["callback"]._pairs, expected)  # the picture reads the pairs the engine chose
    margin = contrast_run["q_values"].max(1).values - contrast_run["q_values"].min(1).values  # two actions
    assert_close_scaled(result.f_input.double(), margin, ulps=8)
    assert contrast_run["callback"]._fit.target.label == "contrast"
    attributions = result.attributions.double()
    scale = float(attributions.abs().mean(0).max())
    logged_abs = [events.Scalars(f"ig/mean_abs/{name}")[-1] for name in FEATURES]
    assert [event.step for event in logged_abs] == [10] * len(FEATURES)
    # The same float32 IG on the same weights; TensorBoard keeps float32: roundings of mean |attr| bound it.
    assert_close_scaled([event.value for event in logged_abs], attributions.abs().mean(0), ulps=16, scale=scale)
    logged_signed = [events.Scalars(f"ig/mean_signed/{name}")[-1].value for name in FEATURES]
    assert_close_scaled(logged_signed, attributions.mean(0), ulps=16, scale=scale)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "contrast" in text


def test_contrast_draws_the_actions_picture_at_the_figures_cadence(contrast_run):
    events = contrast_run["events"]
    assert [event.step for event in events.Images("ig/3_actions")] == [5, 10]
    assert [event.step for event in events.Images("ig/0_verdict")] == [5, 10]
    documented = (REPO / "docs" / "tensorboard-tags.md").read_text()
    for tag in events.Tags()["images"]:
        assert f"`{tag}`" in documented, tag
    assert 'target="contrast"' in documented


@pytest.mark.parametrize("target", ["contrast", "each"])
def test_the_action_targets_leave_training_bit_identical(tmp_path, target):
    def train(with_callback: bool) -> TinyQNet:
        pl.seed_everything(123)
        model = TinyQNet()
        callbacks = []
        if with_callback:
            callbacks.append(
                IntegratedGradientsCallback(
                    held_out_states(), target=target, every_n_steps=3, engine=IGOptions(n_steps=8)
                )
            )
        make_trainer(tmp_path / str(with_callback), callbacks, max_steps=12).fit(model, loader(shuffle=True))
        return model

    without, with_ig = train(False), train(True)
    for (name, a), (_, b) in zip(without.state_dict().items(), with_ig.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs"


def test_contrast_needs_two_outputs_and_unknown_targets_are_refused(tmp_path):
    class OneOutput(TinyQNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)[:, 0]  # (N,)

    callback = IntegratedGradientsCallback(held_out_states(), target="contrast", every_n_steps=5)
    with pytest.raises(ValueError, match="target='contrast' needs at least two outputs"):
        make_trainer(tmp_path, [callback], max_steps=2).fit(OneOutput(), loader())
    with pytest.raises(ValueError, match="'contrast'"):
        IntegratedGradientsCallback(held_out_states(), target="greedy")


def _fit_at_step_4(folder: Path, model: pl.LightningModule, target: str, devices: int, **loader_options: Any) -> Path:
    """A fit of 4 steps with a run and its picture at step 4, on ``devices`` CPU ranks (gloo, ``ddp_spawn``); the
    folder it wrote. A gloo rank can abort as its interpreter shuts down, after its fit (pytorch/pytorch#190489: work
    its threads still hold is freed without the GIL; about 1 run in 50 here): then the fit runs once more in a fresh
    folder, and a second abort fails the test."""

    def fit(root: Path) -> Path:
        callback = IntegratedGradientsCallback(
            held_out_states(),
            target=target,
            every_n_steps=4,
            report_dir=root / "reports",
            overhead=None,
            engine=IGOptions(n_steps=8),
            views=ViewOptions(figure_every_n_runs=1),
        )
        strategy = {"devices": 2, "strategy": "ddp_spawn"} if devices == 2 else {}
        trainer = make_trainer(root, [callback], max_steps=4, logger=TensorBoardLogger(root, name="tb"), **strategy)
        trainer.fit(model, loader(**loader_options))
        return root

    try:
        return fit(folder)
    except torch.multiprocessing.ProcessExitedException as error:
        if error.signal_name != "SIGABRT":
            raise
    return fit(folder.with_name(folder.name + "_again"))


def test_contrast_under_ddp_gathers_every_state_and_draws_the_picture(tmp_path):
    """Two CPU ranks (gloo, ``ddp_spawn``): 37 states split unevenly, the Q-values gathered with the result."""
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0, batchnorm=False)  # fixed weights: the run saw the weights the direct run sees
    states = held_out_states()
    folder = _fit_at_step_4(tmp_path / "world2", model, "contrast", devices=2)
    report = json.loads((folder / "reports" / "ig_report_step=00000004.json").read_text())
    model.eval()
    with noise_disabled(model):
        result = integrated_gradients(model, states, target="contrast", n_steps=8)
    assert report["num_states"] == len(states) and report["forward_target"] == "contrast"
    differences = [state["f_input_minus_f_baseline"] for state in report["completeness"]["per_state"]]
    expected = (result.f_input - result.f_baseline).double()
    assert_close_scaled(differences, expected, ulps=16)
    (log_dir,) = {path.parent for path in (folder / "tb").rglob("events.out.tfevents.*")}  # rank zero's, spawned
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    assert [event.step for event in events.Images("ig/3_actions")] == [4]


# ------------------------------------------------------------------------------------------------ target="each"

ACTIONS = ["left", "right"]


@pytest.fixture(scope="module")
def each_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fit with ``target="each"`` at ``lr=0``, runs at steps 5 and 10 (the last saw the final weights and batch-norm
    statistics), the trust checks on (the default), a JSON report per run."""
    root = tmp_path_factory.mktemp("each")
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0)
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="each",
        action_names=ACTIONS,
        every_n_steps=5,
        feature_names=FEATURES,
        report_dir=root / "reports",
        engine=IGOptions(n_steps=N_STEPS),
        views=ViewOptions(figure_every_n_runs=1),
    )
    tensorboard = TensorBoardLogger(root, name="tb")
    trainer = make_trainer(root, [callback], max_steps=10, logger=tensorboard)
    trainer.fit(model, loader())
    events = EventAccumulator(tensorboard.log_dir, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    model.eval()
    with noise_disabled(model):
        result = integrated_gradients(model, states, target="each", n_steps=N_STEPS)  # (A, B, F)
        with torch.no_grad():
            q_values = model(states).double()
    model.train()
    report = json.loads((root / "reports" / "ig_report_step=00000010.json").read_text())
    return {"callback": callback, "events": events, "result": result, "q_values": q_values, "report": report}


def test_each_logs_every_actions_numbers_as_the_engine_computes_them(each_run):
    callback, events, result = each_run["callback"], each_run["events"], each_run["result"]
    attributions = result.attributions.double()  # (A, B, F)
    scale = float(attributions.abs().mean(1).max())
    for action, name in enumerate(ACTIONS):
        logged = [events.Scalars(f"ig/action/{name}/mean_abs/{feature}")[-1] for feature in FEATURES]
        assert [event.step for event in logged] == [10] * len(FEATURES)
        # The same float32 IG on the same weights; TensorBoard keeps float32: roundings of mean |attr| bound it.
        expected = attributions[action].abs().mean(0)
        assert_close_scaled([event.value for event in logged], expected, ulps=16, scale=scale)
    # The plain per-feature numbers are the mean over the actions (every (state, action) pair alike).
    plain = [events.Scalars(f"ig/mean_abs/{feature}")[-1].value for feature in FEATURES]
    assert_close_scaled(plain, attributions.abs().mean((0, 1)), ulps=16, scale=scale)
    greedy = np.bincount(each_run["q_values"].argmax(1).numpy(), minlength=len(ACTIONS))
    logged_greedy = [events.Scalars(f"ig/action/{name}/greedy_states")[-1].value for name in ACTIONS]
    assert logged_greedy == greedy.tolist() and sum(logged_greedy) == 37
    # Every tag the callback's tags promise for a healthy run is logged, and documented.
    tags = callback._fit.outputs.tags
    drift = {tag for tag in scalar_tags(tags, 10) if tag.startswith("ig/drift/")}  # logged once the ranking moves
    assert set(scalar_tags(tags, 10)) - drift <= set(events.Tags()["scalars"])
    documented = (REPO / "docs" / "tensorboard-tags.md").read_text()
    for pattern in ("ig/action/<action>/mean_abs/<feature>", "ig/action/<action>/greedy_states", 'target="each"'):
        assert f"`{pattern}`" in documented or pattern in documented, pattern
    # The verdict is over every (state, action) pair: the report's worst is the logged one.
    worst = each_run["report"]["completeness"]["worst_mass_relative_error"]
    logged_worst = events.Scalars("ig/completeness/worst_mass_relative_error")[-1].value
    assert_close_scaled(logged_worst, worst, ulps=1)  # float32 in the event file
    assert callback._last.completeness.num_states == 2 * 37


def test_each_draws_the_actions_picture_at_the_figures_cadence(each_run):
    from PIL import Image

    from lightning_ig.views.pictures.draw import actions_picture
    from lightning_ig.views.pictures.raster import CARD_WIDTH, card_sized, png_bytes

    callback, events = each_run["callback"], each_run["events"]
    pictures = events.Images("ig/3_actions")
    assert [event.step for event in pictures] == [5, 10]
    outputs = callback._fit.outputs
    drawn = actions_picture(callback._last, outputs.tags.labels["features"], outputs.inputs)  # the run at step 10
    drawn = card_sized(drawn)  # logged as high as Time Series' image box (padded below), shown at 1.0x there
    logged = np.asarray(Image.open(io.BytesIO(pictures[-1].encoded_image_string)).convert("RGB"))
    assert logged.shape == drawn.shape and drawn.shape[1] == CARD_WIDTH == pictures[-1].width
    assert np.array_equal(logged, np.asarray(Image.open(io.BytesIO(png_bytes(drawn))).convert("RGB")))
    assert {event.step for event in events.Images("ig/0_verdict")} == {5, 10}


def test_each_report_text_has_a_section_per_action(each_run):
    text = each_run["events"].Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    greedy = np.bincount(each_run["q_values"].argmax(1).numpy(), minlength=len(ACTIONS))
    assert "37 states × 2 actions" in text and "target `each`" in text and "(state, action) pairs" in text
    assert "**Per action**" in text
    for name, count in zip(ACTIONS, greedy.tolist()):
        assert any(line.startswith(name) and f"{count}/37" in line for line in text.splitlines()), name


def test_each_report_holds_the_actions_key_of_the_schema(each_run):
    import jsonschema

    from lightning_ig.views.report import load_schema

    report, result = each_run["report"], each_run["result"]
    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)
    assert report["num_states"] == 37 and report["forward_target"] == "each"
    per_state = report["completeness"]["per_state"]
    assert [(row["state_idx"], row["action"]) for row in per_state] == [(s, a) for s in range(37) for a in range(2)]
    change = (result.f_input - result.f_baseline).double().T.reshape(-1)  # (A, B) -> state-major
    assert_close_scaled([row["f_input_minus_f_baseline"] for row in per_state], change, ulps=16)
    attributions = result.attributions.double()
    scale = float(attributions.abs().mean(1).max())
    for action, entry in enumerate(report["actions"]):
        assert entry["action"] == action and entry["name"] == ACTIONS[action] and entry["units"] == "features"
        top = {row["name"]: row["mean_abs"] for row in entry["top_10_by_mean_abs"]}
        expected = attributions[action].abs().mean(0)
        assert_close_scaled([top[name] for name in FEATURES], expected, ulps=16, scale=scale)
        assert entry["completeness"]["verdict"]["within"] is True and "per_state" not in entry["completeness"]


def test_each_needs_two_outputs_and_action_names_that_fit(tmp_path):
    class OneOutput(TinyQNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)[:, 0]  # (N,)

    callback = IntegratedGradientsCallback(held_out_states(), target="each", every_n_steps=5)
    with pytest.raises(ValueError, match="target='each' needs at least two outputs per state"):
        make_trainer(tmp_path, [callback], max_steps=2).fit(OneOutput(), loader())
    named = IntegratedGradientsCallback(held_out_states(), target="each", every_n_steps=5, action_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="action_names has 3 names but the model returns 2 actions"):
        make_trainer(tmp_path, [named], max_steps=2).fit(TinyQNet(), loader())
    with pytest.raises(ValueError, match="action_names label the actions"):
        IntegratedGradientsCallback(held_out_states(), action_names=["a", "b"])  # target="mean": no action
    with pytest.raises(TypeError, match="action_names must be a list of strings"):
        IntegratedGradientsCallback(held_out_states(), target="each", action_names="left")


def test_each_under_ddp_equals_one_process(tmp_path):
    """Two CPU ranks (gloo, ``ddp_spawn``), 37 states split unevenly (19 and 18 plus a padding state), against one
    process: the same pairs, the same actions' numbers, the picture on rank zero."""

    def fit(devices: int) -> dict[str, Any]:
        pl.seed_everything(0)
        model = TinyQNet(lr=0.0, batchnorm=False)  # fixed weights: every run sees the weights the other sees
        folder = _fit_at_step_4(tmp_path / f"world{devices}", model, "each", devices, shuffle=False)
        (log_dir,) = {path.parent for path in (folder / "tb").rglob("events.out.tfevents.*")}  # rank zero's
        events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
        events.Reload()
        assert [event.step for event in events.Images("ig/3_actions")] == [4]
        return json.loads((folder / "reports" / "ig_report_step=00000004.json").read_text())

    one, two = fit(1), fit(2)
    assert two["world_size"] == 2 and one["world_size"] == 1 and two["num_states"] == one["num_states"] == 37
    rows_one, rows_two = one["completeness"]["per_state"], two["completeness"]["per_state"]
    assert [(r["state_idx"], r["action"]) for r in rows_two] == [(r["state_idx"], r["action"]) for r in rows_one]
    for field in ("sum_attributions", "f_input_minus_f_baseline"):
        expected = [row[field] for row in rows_one]
        assert_close_scaled([row[field] for row in rows_two], expected, ulps=16, scale=max(map(abs, expected)))
    scale = max(row["mean_abs"] for action in one["actions"] for row in action["top_10_by_mean_abs"])
    for action_one, action_two in zip(one["actions"], two["actions"], strict=True):
        assert action_two["greedy_states"] == action_one["greedy_states"]
        top_one = {row["name"]: row["mean_abs"] for row in action_one["top_10_by_mean_abs"]}
        top_two = {row["name"]: row["mean_abs"] for row in action_two["top_10_by_mean_abs"]}
        assert top_two.keys() == top_one.keys()
        assert_close_scaled([top_two[k] for k in top_one], list(top_one.values()), ulps=16, scale=scale)


def test_each_on_frames_logs_group_tags_per_action_and_the_saliency_of_the_mean(tmp_path):
    """(3, 8, 8) frames: the channels are the groups, the actions' tags are per group, the grid shows the mean over
    the actions, and the report's actions list groups."""
    pl.seed_everything(0)
    shape = (3, 8, 8)
    model = ConvQNet(shape, lr=0.0)
    frames = torch.rand(6, *shape, generator=torch.Generator().manual_seed(3))
    data = DataLoader(TensorDataset(torch.rand(32, *shape), torch.rand(32, 2)), batch_size=8)
    callback = IntegratedGradientsCallback(
        frames,
        target="each",
        every_n_steps=2,
        overhead=None,
        report_dir=tmp_path / "reports",
        engine=IGOptions(n_steps=8),
        views=ViewOptions(saliency_every_n_runs=1),
    )
    logger = TensorBoardLogger(tmp_path, name="tb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the groups chosen for 192 features are said once
        make_trainer(tmp_path, [callback], max_steps=2, logger=logger).fit(model, data)
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {f"ig/action/action {a}/group/mean_abs/channel {c}" for a in range(2) for c in range(3)}
    assert expected <= scalars and not any(tag.startswith("ig/action/action 0/mean_abs") for tag in scalars)
    assert [event.step for event in events.Images("ig/2_saliency")] == [2]
    assert [event.step for event in events.Images("ig/3_actions")] == [2]
    model.eval()
    with noise_disabled(model):
        value = integrated_gradients(model, frames, target="mean", n_steps=8).attributions.double()
    # The grid's states are drawn with the mean over their actions: by linearity the attributions of V(s).
    samples = callback._fit.outputs.last_host.sample_attributions  # (states drawn x actions, 3, 8, 8)
    mean = samples.reshape(-1, 2, *shape).mean(1)
    assert_close_scaled(mean, value[: len(mean)].numpy(), ulps=64, scale=float(value.abs().max()))
    report = json.loads((tmp_path / "reports" / "ig_report_step=00000002.json").read_text())
    assert report["actions"][0]["units"] == "groups"
    assert {row["name"] for row in report["actions"][0]["top_10_by_mean_abs"]} == {
        "channel 0",
        "channel 1",
        "channel 2",
    }


def test_each_sends_the_actions_picture_and_its_report_to_the_picture_sinks(tmp_path, monkeypatch):
    """W&B and MLflow get what TensorBoard gets (their own tests write through the real packages): here a sink
    that keeps what it is handed, in place of the loggers' ones."""
    from lightning_ig.callback import fit as fit_module

    class KeptSink:
        def __init__(self) -> None:
            self.drawn: list[tuple[str, int]] = []
            self.reports: list[dict[str, Any]] = []

        def pictures(self, pictures: dict[str, np.ndarray], step: int) -> None:
            self.drawn.extend((tag, step) for tag in pictures)

        def table(self, tag: str, columns: Any, rows: Any, step: int) -> None:
            pass

        def report(self, name: str, report: dict[str, Any], step: int) -> None:
            self.reports.append(report)

    sink = KeptSink()
    monkeypatch.setattr(fit_module, "picture_sinks", lambda loggers: [sink])
    callback = IntegratedGradientsCallback(
        held_out_states(),
        target="each",
        every_n_steps=4,
        overhead=None,
        engine=IGOptions(n_steps=8),
    )
    make_trainer(tmp_path, [callback], max_steps=4, logger=TensorBoardLogger(tmp_path, name="tb")).fit(
        TinyQNet(), loader()
    )
    assert ("ig/3_actions", 4) in sink.drawn
    (report,) = sink.reports
    assert report["num_states"] == 37 and [action["name"] for action in report["actions"]] == ["action 0", "action 1"]
