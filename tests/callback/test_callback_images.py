"""Images and wide vectors: bounded tags, groups, saliency images, several callbacks in one Trainer."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.views import ViewOptions
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, card_sized
from lightning_ig.views.pictures.saliency import GRID_FRAMES, first_distinct, saliency_grid
from lightning_ig.views.report import load_schema
from tests.support.tags import scalar_tags
from tests.support.tiny import ConvQNet, frame_dataset, frames, make_trainer
from tests.support.tolerance import assert_close_scaled
from tests.support.trust import checks_without_budget, trust_scalar_tags

ALL = {"scalars": 0, "histograms": 0, "images": 0, "tensors": 0}


def _fit(
    root: Path, shape: tuple[int, ...], callbacks: list, max_steps: int = 4, seed: int = 0
) -> tuple[ConvQNet, TensorBoardLogger]:
    torch.manual_seed(seed)
    model = ConvQNet(shape)
    logger = TensorBoardLogger(root, name="tb")
    data = DataLoader(frame_dataset(64, shape), batch_size=16)
    make_trainer(root, callbacks, max_steps=max_steps, logger=logger).fit(model, data)
    return model, logger


def _events(logger: TensorBoardLogger) -> EventAccumulator:
    events = EventAccumulator(logger.log_dir, size_guidance=ALL)
    events.Reload()
    return events


def _direct(model: ConvQNet, states: torch.Tensor, n_steps: int):
    model.eval()
    return integrated_gradients(model, states, target="mean", n_steps=n_steps)


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("images")
    states = frames(10, (3, 16, 16), seed=1)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, report_dir=root / "reports", engine=IGOptions(n_steps=16)
    )
    with warnings.catch_warnings(record=True) as caught, checks_without_budget():  # every trust tag at the first run
        warnings.simplefilter("always")
        model, logger = _fit(root, (3, 16, 16), [callback])
    return {
        "root": root,
        "states": states,
        "model": model,
        "events": _events(logger),
        "warnings": caught,
        "callback": callback,
    }


def test_image_states_log_channels_not_pixels_with_a_bounded_number_of_tags(image_run):
    tags = image_run["events"].Tags()
    scalars, histograms, images = set(tags["scalars"]), set(tags["histograms"]), set(tags["images"])
    channels = [f"channel {c}" for c in range(3)]
    assert {f"ig/group/mean_abs/{name}" for name in channels} <= scalars
    assert {f"ig/group/mean_signed/{name}" for name in channels} <= scalars
    assert {f"ig/group/attributions/{name}" for name in channels} == histograms
    assert not any(tag.startswith(("ig/mean_abs/", "ig/mean_signed/")) for tag in scalars)  # 768 features: none
    assert {"ig/concentration/top1pct_share", "ig/concentration/top10pct_share"} <= scalars
    assert "ig/drift/topk_jaccard_prev" not in scalars  # 3 channels <= top_k: the overlap is 1 by construction
    assert (
        len(scalars) + len(histograms) + len(images) + len(tags["tensors"]) <= 40
    )  # not one tag per pixel (1,542 scalar tags for these states)
    trust = trust_scalar_tags("ig", noisy=False)  # the trust checks' (without the budget: at the first run)
    expected = {*scalar_tags(image_run["callback"]._fit.outputs.tags, 10), *trust, "ig/overhead"}  # the budget's
    logged = {tag for tag in scalars if tag.startswith("ig/")}
    assert logged <= expected and all(tag.startswith("ig/drift/") for tag in expected - logged)  # drift once it moves
    grouping = [str(w.message) for w in image_run["warnings"] if "max_logged_features" in str(w.message)]
    assert len(grouping) == 1 and "768 features" in grouping[0] and "3 groups (channel 0, ...)" in grouping[0]


def test_group_scalars_are_the_sums_of_their_members(image_run):
    events, states = image_run["events"], image_run["states"]
    result = _direct(image_run["model"], states, n_steps=16)
    per_channel = result.attributions.double().sum((2, 3))  # (B, 3)
    logged = [events.Scalars(f"ig/group/mean_abs/channel {c}")[-1].value for c in range(3)]
    assert_close_scaled(
        logged, per_channel.abs().mean(0), ulps=64, scale=float(result.attributions.abs().sum((1, 2, 3)).max())
    )
    report = json.loads((image_run["root"] / "reports" / "ig_report_step=00000004.json").read_text())
    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)
    assert [(g["name"], g["members"]) for g in report["groups"]] == [(f"channel {c}", 256) for c in range(3)]
    assert_close_scaled(
        [g["mean_signed"] for g in report["groups"]],
        per_channel.mean(0),
        ulps=64,
        scale=float(result.attributions.abs().sum((1, 2, 3)).max()),
    )
    assert report["state_dim"] == 768 and len(report["features"]) == 768


def assert_same_picture(logged: np.ndarray, expected: np.ndarray) -> None:
    """The logged picture is the expected one, up to its palette of 256 colours (views/pictures/raster.py's png_bytes).

    A picture of other attributions or states is tens of levels off on average; the palette costs about 2.5
    (of 255) and at most a few tens on rare pixels; the float32 run and the float64 reference round a few
    pixels one colour step apart.
    """
    assert logged.shape == expected.shape
    error = np.abs(logged.astype(int) - expected.astype(int))
    assert error.mean() <= 4.0 and np.mean(error > 32) < 0.002


def _expected_grid(
    states: torch.Tensor, result: Any, count: int = GRID_FRAMES, previous: float | None = None
) -> np.ndarray:
    """The grid the callback draws: its first ``count`` distinct states, in the channels' colours, named by the
    channel groups, with V(s) and its change from the all-zero frame under each tile."""
    picked = first_distinct(states.numpy(), count)
    f_input, f_baseline = result.f_input.double().numpy(), result.f_baseline.double().numpy()
    return saliency_grid(
        states.numpy()[picked],
        result.attributions.double().numpy()[picked],
        channel_names=[f"channel {c}" for c in range(states.shape[1])],
        f_input=f_input[picked],
        f_delta=(f_input - f_baseline)[picked],
        previous_scale=previous,
    ).pixels


def test_saliency_images_are_logged_with_their_size_and_pixels(image_run):
    events, states = image_run["events"], image_run["states"]
    result = _direct(image_run["model"], states, n_steps=16)
    pixels = card_sized(_expected_grid(states, result))
    # logged as high as Time Series' image box, so it is shown at 1.0x
    logged = events.Images("ig/2_saliency")
    assert [event.step for event in logged] == [2, 4]
    assert (logged[-1].height, logged[-1].width) == pixels.shape[:2] == (CARD_HEIGHT, CARD_WIDTH)
    decoded = np.asarray(Image.open(io.BytesIO(logged[-1].encoded_image_string)).convert("RGB"))
    assert decoded.dtype == np.uint8 and decoded.shape == pixels.shape
    assert_same_picture(decoded, pixels)
    texts = {
        event.step: event.tensor_proto.string_val[0].decode() for event in events.Tensors("ig/report/text_summary")
    }
    assert "**Saliency** (`ig/2_saliency`): colour scale ±" in texts[2]  # the first run draws them (every 10 runs)
    assert "**Saliency**" in texts[4]  # the second, at the fit's last step, is the final run: it draws them too


def test_pictures_that_share_a_cadence_are_spread_over_it(tmp_path):
    states = frames(4, (2, 8, 8), seed=6)
    callback = IntegratedGradientsCallback(
        states,
        every_n_steps=1,
        engine=IGOptions(n_steps=4),
        views=ViewOptions(saliency_every_n_runs=8, figure_every_n_runs=8),
    )
    _, logger = _fit(tmp_path, (2, 8, 8), [callback], max_steps=20)  # runs 0..19 at steps 1..20
    events = _events(logger)
    steps = {tag: [event.step for event in events.Images(tag)] for tag in ("ig/1_over_training", "ig/2_saliency")}
    assert steps == {
        "ig/1_over_training": [1, 3, 11, 19, 20],  # runs 0, 2, 10, 18: a third of the cadence later, and the end
        "ig/2_saliency": [1, 6, 14, 20],  # runs 0, 5, 13: two thirds
    }
    verdicts = [event.step for event in events.Images("ig/0_verdict")]
    assert {1, 9, 17, 20} <= set(verdicts)  # runs 0, 8, 16 and the end; also where the verdict changed
    # besides the first and the last run, the pictures on the cadence never share a run
    later = [step for tag_steps in [*steps.values(), [9, 17]] for step in tag_steps if step not in (1, 20)]
    assert len(later) == len(set(later))


@pytest.mark.parametrize(
    ("every", "at_end", "expected"),
    [
        (3, True, [1, 4, 7]),  # runs 0..6 at steps 1..7: the grid at runs 0, 3, 6
        (10, True, [1, 7]),  # the default: the first run, the end
        (10, False, [1, 7]),  # no run at the end: the last run's pictures are drawn then
        (1, True, [1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_saliency_cadence(tmp_path, every, at_end, expected):
    states = frames(4, (2, 8, 8), seed=5)
    callback = IntegratedGradientsCallback(
        states,
        every_n_steps=1,
        run_at_train_end=at_end,
        engine=IGOptions(n_steps=4),
        views=ViewOptions(saliency_every_n_runs=every, figure_every_n_runs=None),
    )
    model, logger = _fit(tmp_path, (2, 8, 8), [callback], max_steps=7)
    events = _events(logger)
    assert [event.step for event in events.Images("ig/2_saliency")] == expected
    assert [event.step for event in events.Tensors("ig/report/text_summary")] == list(range(1, 8))  # text every run
    last = np.asarray(Image.open(io.BytesIO(events.Images("ig/2_saliency")[-1].encoded_image_string)).convert("RGB"))
    result = _direct(model, states, n_steps=4)  # the model as trained: the pictures at the end are the last run's
    expected_last = _expected_grid(states, result)
    # the first row of frames and their captions; the legend beside the second may add "(was ...)": the earlier scale
    tiles = slice(0, (CARD_HEIGHT + 16) // 2)
    assert_same_picture(last[tiles], expected_last[tiles])


def test_wide_vectors_log_blocks_and_named_groups(tmp_path):
    states = frames(12, (256,), seed=2)
    callback = IntegratedGradientsCallback(states, every_n_steps=2, engine=IGOptions(n_steps=8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, logger = _fit(tmp_path / "blocks", (256,), [callback])
    tags = _events(logger).Tags()
    scalars = set(tags["scalars"])
    assert "ig/group/mean_abs/x000..x003" in scalars and "ig/group/mean_abs/x252..x255" in scalars  # sort as numbers
    assert len(scalars) + len(tags["histograms"]) <= 3 * 64 + 12 + len(trust_scalar_tags("ig", noisy=True))
    assert any("64 groups (x000..x003, ...)" in str(w.message) for w in caught)  # as the tags name it

    named = {f"family {k}": list(range(32 * k, 32 * k + 32)) for k in range(8)}
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, feature_groups=named, engine=IGOptions(n_steps=8), views=ViewOptions(top_k=3)
    )
    _, logger = _fit(tmp_path / "named", (256,), [callback])
    scalars = set(_events(logger).Tags()["scalars"])
    assert {f"ig/group/mean_abs/family {k}" for k in range(8)} <= scalars
    assert "ig/drift/topk_jaccard_prev" in scalars and len(scalars) <= 2 * 8 + 12 + len(
        trust_scalar_tags("ig", noisy=True)
    )


def test_more_groups_than_max_logged_features_are_not_logged_one_by_one(tmp_path):
    # guards against: feature_groups="features" on 30,000 features logged 90,000 scalar and histogram tags a run
    # (21 MB of events a run), beyond the limit that bounds the features' and the actions' tags
    states = frames(12, (256,), seed=2)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, feature_groups="features", engine=IGOptions(n_steps=8), report_dir=tmp_path / "r"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, logger = _fit(tmp_path / "features", (256,), [callback])
    tags = _events(logger).Tags()
    assert not [tag for tag in tags["scalars"] + tags["histograms"] if tag.startswith("ig/group/")]
    assert "ig/drift/spearman_prev" in tags["scalars"] and "ig/0_verdict" in tags["images"]  # ranked over the groups
    assert any("256 feature_groups, more than max_logged_features=64" in str(w.message) for w in caught)
    report = json.loads(sorted((tmp_path / "r").glob("*.json"))[-1].read_text())
    assert len(report["groups"]) == 256  # the report keeps every group


def test_one_dimensional_signals_get_heat_strips(tmp_path):
    states = frames(6, (2, 40), seed=3)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, engine=IGOptions(n_steps=8), views=ViewOptions(saliency_states=3)
    )
    _, logger = _fit(tmp_path, (2, 40), [callback], max_steps=2)
    events = _events(logger)
    strip = events.Images("ig/2_saliency")[-1]
    # 3 strips of 2 channels, captions and a colour bar, at the card's width; white below to Time Series' box height
    assert (strip.width, strip.height) == (CARD_WIDTH, CARD_HEIGHT)
    pixels = np.asarray(Image.open(io.BytesIO(strip.encoded_image_string)).convert("RGB"))
    assert np.nonzero((pixels < 200).any(axis=(1, 2)))[0].max() < 200  # ink (the PNG has 256 colours: near-white)


class _Stacked(ConvQNet):
    """Stacks of RGB frames, ``(T, C, H, W)`` states (frame stacking of colour frames), flattened into a linear head."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__((int(np.prod(shape)),))
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.reshape(len(x), -1))


def test_stacked_frames_are_drawn_with_their_frames_as_channels(tmp_path):
    # guards against: the automatic groups of (T, C, H, W) states are dim 0's T channels, whose T names the saliency
    # grid, which draws T * C channels, refused in the pictures' thread ("got 6 channel colours and 2 channel names
    # for 6 channels"): the fit stopped at the first run's end
    shape = (2, 3, 4, 5)
    states = frames(6, shape, seed=4)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, engine=IGOptions(n_steps=8), views=ViewOptions(saliency_states=3)
    )
    torch.manual_seed(0)
    logger = TensorBoardLogger(tmp_path, name="tb")
    data = DataLoader(frame_dataset(64, shape), batch_size=16)
    make_trainer(tmp_path, [callback], max_steps=4, logger=logger).fit(_Stacked(shape), data)
    assert [entry["global_step"] for entry in callback.history] == [2, 4]
    assert "ig/2_saliency" in _events(logger).Tags()["images"]


def test_two_named_callbacks_write_apart(tmp_path):
    states = frames(6, (3, 16, 16), seed=4)
    value = IntegratedGradientsCallback(
        states, every_n_steps=2, name="value", report_dir=tmp_path / "r", engine=IGOptions(n_steps=8)
    )
    action = IntegratedGradientsCallback(
        states,
        every_n_steps=2,
        name="action 1",
        target=1,
        report_dir=tmp_path / "r",
        feature_groups="channels",
        engine=IGOptions(n_steps=8),
    )
    _, logger = _fit(tmp_path, (3, 16, 16), [value, action], max_steps=2)
    events = _events(logger)
    scalars = set(events.Tags()["scalars"])
    assert "ig/value/group/mean_abs/channel 0" in scalars and "ig/action 1/group/mean_abs/channel 0" in scalars
    assert not any(tag.startswith("ig/group/") for tag in scalars)
    assert sorted(path.name for path in (tmp_path / "r").iterdir()) == [
        "ig_report_action 1_step=00000002.json",
        "ig_report_value_step=00000002.json",
    ]
    assert {"ig/value/0_verdict", "ig/action 1/0_verdict"} <= set(events.Tags()["images"])
    assert value.state_key != action.state_key


def test_two_callbacks_with_one_name_fail_before_training(tmp_path):
    states = frames(6, (3, 16, 16))
    callbacks = [
        IntegratedGradientsCallback(states, every_n_steps=2),
        IntegratedGradientsCallback(states, every_n_steps=2, target=1),
    ]
    with pytest.raises(MisconfigurationException, match="2 IntegratedGradientsCallbacks would write the same tags"):
        _fit(tmp_path, (3, 16, 16), callbacks)
