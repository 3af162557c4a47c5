"""A run the callback cannot vouch for is never logged as clean: NaN/Inf, nothing checked, bad report folders."""

from __future__ import annotations

import io
import json
import math
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_ig import NonFiniteAttributionError
from lightning_ig._files import OutputPathError
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from tests.support.tiny import FEATURES, TinyQNet, dataset, held_out_states, make_trainer


def loader() -> DataLoader:
    return DataLoader(dataset(), batch_size=16, shuffle=False)


class _BreakWeights(Callback):
    """Sets one weight to NaN after optimizer step ``at``, as a diverging run would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            with torch.no_grad():
                pl_module.body[0].weight[0, 0] = math.nan


def _events(logger: TensorBoardLogger) -> EventAccumulator:
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _fit(
    tmp_path: Path, callback: IntegratedGradientsCallback, *extra: Callback, max_steps: int = 6
) -> TensorBoardLogger:
    logger = TensorBoardLogger(tmp_path, name="tb")
    model = TinyQNet(noisy=False, dropout=0.0, batchnorm=False)
    make_trainer(tmp_path, [callback, *extra], max_steps=max_steps, logger=logger).fit(model, loader())
    return logger


def test_nan_weights_are_logged_as_inf_with_a_count_and_one_warning(tmp_path):
    # guards against: worst_relative_error 0.0 at the runs after the weights went NaN, and no warning
    callback = IntegratedGradientsCallback(
        held_out_states(),
        every_n_steps=2,
        feature_names=FEATURES,
        report_dir=tmp_path / "reports",
        engine=IGOptions(n_steps=8),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = _fit(tmp_path, callback, _BreakWeights(at=3))
    events = _events(logger)
    worst = {event.step: event.value for event in events.Scalars("ig/completeness/worst_attribution_error")}
    counts = {event.step: event.value for event in events.Scalars("ig/completeness/non_finite_states")}
    assert math.isfinite(worst[2]) and 2 not in counts  # the count's card appears with its first non-zero run
    assert worst[4] == math.inf and worst[6] == math.inf
    assert counts[4] == counts[6] == 37
    messages = [str(w.message) for w in caught if "NaN/Inf" in str(w.message)]
    assert len(messages) == 1 and "at step 4 in 37 of 37 held-out states (first: state 0)" in messages[0]
    report = json.loads((tmp_path / "reports" / "ig_report_step=00000004.json").read_text())
    assert report["non_finite_states"] == list(range(37))
    assert report["completeness"]["worst_relative_error"] is None
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "The model produced NaN/Inf in 37 of 37 states" in text
    # every failing run has its own verdict card, off the cadence (10 runs), and it never says ✓
    from PIL import Image

    from lightning_ig.views.pictures.cards import STATE_COLOURS
    from lightning_ig.views.pictures.raster import rgb

    images = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    images.Reload()
    cards = {event.step: event for event in images.Images("ig/0_verdict")}
    assert {2, 4, 6} <= set(cards)
    for step in (4, 6):
        head = np.asarray(Image.open(io.BytesIO(cards[step].encoded_image_string)).convert("RGB"))[16:34]  # the verdict
        near = {
            state: (np.abs(head.astype(int) - rgb(STATE_COLOURS[state])).max(axis=2) <= 6) for state in STATE_COLOURS
        }
        assert near["fail"].sum() > 20 and not near["pass"].any(), step  # the palette PNG: a few levels off


def test_on_non_finite_raise_stops_training(tmp_path):
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=2, on_non_finite="raise", engine=IGOptions(n_steps=8)
    )
    with pytest.raises(
        NonFiniteAttributionError, match=r"NaN/Inf at step 4 .* training stopped \(on_non_finite='raise'\)"
    ):
        _fit(tmp_path, callback, _BreakWeights(at=3), max_steps=10)
    assert [entry["global_step"] for entry in callback.history] == [2, 4]  # nothing ran after the raise


def _constant(pl_module: TinyQNet, x: torch.Tensor) -> torch.Tensor:
    return pl_module(x).mean(1) * 0.0 + 1.0  # F(x) == F(b) everywhere: no state can be judged by a ratio


def test_a_run_where_no_state_can_be_checked_reads_as_such(tmp_path):
    # guards against: worst_relative_error 0.0, a perfect score
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=2, forward=_constant, engine=IGOptions(n_steps=8)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = _fit(tmp_path, callback, max_steps=4)
    events = _events(logger)
    assert all(math.isnan(event.value) for event in events.Scalars("ig/completeness/worst_attribution_error"))
    assert [event.value for event in events.Scalars("ig/completeness/degenerate_states")] == [37, 37]
    messages = [str(w.message) for w in caught if "no state could be checked" in str(w.message)]
    assert len(messages) == 1
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "? Accuracy not checked: in all 37 states" in text


def test_report_dir_that_is_a_file_or_cannot_be_made_fails_at_setup(tmp_path):
    # guards against: set-up passed, and training crashed at the first IG run with a raw pathlib error
    existing = tmp_path / "reports.json"
    existing.write_text("{}")
    for folder, words in ((existing, "is a file, not a folder"), (existing / "sub", "cannot be created")):
        callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=1, report_dir=folder)
        with pytest.raises(OutputPathError, match=f"report_dir '{folder}' {words}"):
            make_trainer(tmp_path, [callback], max_steps=1).fit(TinyQNet(), loader())
    assert existing.read_text() == "{}"


def test_report_files_are_readable_by_others_under_the_usual_umask(tmp_path):
    # guards against: 0600 whatever the umask
    previous = os.umask(0o022)
    try:
        callback = IntegratedGradientsCallback(
            held_out_states(), every_n_steps=2, report_dir=tmp_path / "r", engine=IGOptions(n_steps=4)
        )
        make_trainer(tmp_path, [callback], max_steps=2).fit(TinyQNet(), loader())
    finally:
        os.umask(previous)
    (report,) = (tmp_path / "r").glob("*.json")
    assert stat.S_IMODE(report.stat().st_mode) == 0o644


def _with_dropout(pl_module: TinyQNet, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(pl_module(x), 0.5, training=True).mean(1)  # random even in eval mode


def test_a_stochastic_forward_warns_once_and_is_reported(tmp_path):
    # guards against: attributed silently (a 326% completeness error and no word why)
    callback = IntegratedGradientsCallback(
        held_out_states(),
        every_n_steps=2,
        forward=_with_dropout,
        report_dir=tmp_path / "r",
        engine=IGOptions(n_steps=8),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = _fit(tmp_path, callback, max_steps=4)
    messages = [str(w.message) for w in caught if "different values" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith(
        "IntegratedGradientsCallback: the forward gave different values"
    )
    report = json.loads((tmp_path / "r" / "ig_report_step=00000004.json").read_text())
    assert report["stochastic_forward"] is True
    # not a trusted explanation, at every run (between checks too): the status fails and says why
    assert [entry["trust"] for entry in callback.history] == ["failed", "failed"]
    assert report["trust"]["status"] == "failed" and any(
        r.startswith("random forward: different values") for r in report["trust"]["reasons"]
    )
    text = _events(logger).Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "**The forward is random**" in text


@pytest.mark.parametrize(
    ("options", "noisy", "skipped"),
    [
        ({"target": "contrast"}, False, {"deletion"}),  # its pair, chosen at each state: not for a deleted one
        ({"feature_groups": {"all": [0, 1, 2, 3]}}, False, set()),  # one group: the checks rank the features
        ({"states": 1}, False, {"deletion"}),  # one state: no standard error over states (it read "undefined")
    ],
)
def test_a_check_that_cannot_apply_is_left_out_not_failed(tmp_path, options, noisy, skipped):
    options = dict(options)  # a copy: the parameters are shared between runs of the test
    states = held_out_states()[: options.pop("states", None)]
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, engine=IGOptions(n_steps=64), report_dir=tmp_path / "r", **options
    )
    model = TinyQNet(noisy=noisy, dropout=0.0, batchnorm=False)
    make_trainer(tmp_path, [callback], max_steps=4, logger=TensorBoardLogger(tmp_path, name="tb")).fit(model, loader())
    trust = json.loads(sorted((tmp_path / "r").glob("*.json"))[-1].read_text())["trust"]
    assert trust["status"] == "passed", trust  # the accuracy and the checks that apply: a tanh net at 64 points
    checks = {"sanity", "faithfulness", "stability"} if noisy else {"sanity", "faithfulness"}
    made = checks - {"faithfulness" if name == "deletion" else name for name in skipped}
    assert made == {name for name in checks if trust["checks"][name] is not None}, trust
    assert not any(name in line for line in trust["reasons"] for name in skipped), trust
