"""The picture worker: jobs in order, errors surfaced, nothing left running, pictures kept when training fails."""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from lightning_ig.attribution import IGOptions
from lightning_ig.views.loggers.outputs import scalar_metrics
from lightning_ig.views.loggers.worker import PictureWriter
from lightning_ig.views.tags import COUNT_TAGS, TagNames
from tests.support.summaries import make_summary
from tests.support.tags import scalar_tags


def _worker_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("lightning-ig-pictures")]


def test_jobs_run_in_order_off_the_calling_thread_and_wait_returns_when_all_ran():
    pictures, seen = PictureWriter(), []

    def job(index: int) -> None:
        time.sleep(0.002 * (5 - index))  # later jobs are quicker: only the order of submission keeps them in order
        seen.append((index, threading.current_thread().name))

    for index in range(5):
        pictures.submit(job, index)
    pictures.wait()
    assert [index for index, _ in seen] == list(range(5))
    assert all(name.startswith("lightning-ig-pictures") for _, name in seen)
    pictures.close()
    assert not _worker_threads()


def test_a_failed_job_raises_at_wait_and_the_next_jobs_still_run():
    pictures, seen = PictureWriter(), []

    def fail() -> None:
        raise OSError("disk full")

    pictures.submit(fail)
    pictures.submit(seen.append, "after")
    with pytest.raises(OSError, match="disk full"):
        pictures.wait()
    pictures.close()  # nothing left to raise
    assert seen == ["after"] and not _worker_threads()


def test_close_is_idempotent_and_a_later_job_starts_a_new_worker():
    pictures, seen = PictureWriter(), []
    pictures.close()
    pictures.submit(seen.append, 1)
    pictures.close()
    pictures.close()
    pictures.submit(seen.append, 2)
    pictures.close()
    assert seen == [1, 2] and not _worker_threads()


def test_a_copy_starts_without_the_worker_or_its_jobs():
    pictures = PictureWriter()
    pictures.submit(time.sleep, 0.01)
    twin = copy.deepcopy(pictures)
    twin.wait()  # nothing pending in the copy
    pictures.close()
    twin.submit(lambda: None)
    twin.close()
    assert not _worker_threads()


def test_pictures_drawn_before_training_fails_are_in_the_event_file(tmp_path: Path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.data import DataLoader

    from lightning_ig.callback import IntegratedGradientsCallback
    from tests.support.tiny import ConvQNet, frame_dataset, frames, make_trainer

    class FailsAfterTheFirstRun(ConvQNet):
        def training_step(self, batch, batch_idx):
            if self.global_step == 1:  # just after run 0 (step 1) handed its pictures to the worker
                raise RuntimeError("the training broke")
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    callback = IntegratedGradientsCallback(frames(4, (2, 8, 8), seed=1), every_n_steps=1, engine=IGOptions(n_steps=4))
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = make_trainer(tmp_path, [callback], max_steps=6, logger=logger)
    with pytest.raises(RuntimeError, match="the training broke"):
        trainer.fit(FailsAfterTheFirstRun((2, 8, 8)), DataLoader(frame_dataset(64, (2, 8, 8)), batch_size=16))
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert {"ig/0_verdict", "ig/1_over_training", "ig/2_saliency"} <= set(events.Tags()["images"])
    assert [event.step for event in events.Images("ig/2_saliency")] == [1]  # the first run drew every picture
    assert not _worker_threads()  # on_exception waited for the pictures and stopped the worker


def test_count_cards_appear_at_their_first_non_zero_run_and_stay():
    from lightning_ig.views.loggers.outputs import informative_scalars

    tags = TagNames("ig", ["a", "b"], None, num_features=2)
    zero = {"ig/completeness/non_finite_states": 0.0, "ig/completeness/degenerate_states": 0.0, "ig/time_ms": 1.0}
    kept, seen = informative_scalars(zero, tags)
    assert kept == {"ig/time_ms": 1.0} and seen == set()  # a count flat at 0 is no card
    kept, seen = informative_scalars({**zero, "ig/completeness/degenerate_states": 3.0}, tags, seen)
    assert kept["ig/completeness/degenerate_states"] == 3.0 and "ig/completeness/non_finite_states" not in kept
    kept, seen = informative_scalars(zero, tags, seen)  # from then on logged every run, zeros included: no gaps
    assert kept["ig/completeness/degenerate_states"] == 0.0 and seen == {"ig/completeness/degenerate_states"}


def test_the_top10_share_is_left_out_where_it_equals_the_top1_share():
    from lightning_ig.views.loggers.outputs import informative_scalars

    shares = {"ig/concentration/top1pct_share": 0.5, "ig/concentration/top10pct_share": 0.5}
    assert (
        "ig/concentration/top10pct_share"
        not in informative_scalars(shares, TagNames("ig", None, None, num_features=10))[0]
    )
    assert (
        "ig/concentration/top10pct_share" in informative_scalars(shares, TagNames("ig", None, None, num_features=11))[0]
    )


def test_each_logs_its_actions_per_unit_only_within_the_limit():
    import dataclasses

    from lightning_ig.attribution import integrated_gradients
    from lightning_ig.attribution.targets import Target
    from lightning_ig.callback.per_action import pair_rows
    from lightning_ig.run.host_result import HostResult
    from lightning_ig.run.summary import RunSettings, summarize
    from lightning_ig.views.loggers.outputs import scalar_metrics
    from tests.support.tolerance import assert_close_scaled

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    result = integrated_gradients(model, torch.randn(6, 3), target="each", n_steps=8)
    host = HostResult.from_result(pair_rows(result), keep_attributions=True)
    settings = RunSettings(Target.parse("each").bind((6, 2), ["up", "down/left"]), "zeros", 0.01, 10)
    names = ["a", "b", "c"]
    summary = summarize(host, feature_names=names, log_features=True, settings=settings, step=7)
    tags = dataclasses.replace(
        TagNames.build(None, names, None, generated_features=False, generated_groups=False, num_features=3),
        action_labels=["up", "down∕left"],
        action_units=True,
    )
    metrics = scalar_metrics(summary, tags)
    per_unit = {tag: value for tag, value in metrics.items() if tag.startswith("ig/action/")}
    expected = {f"ig/action/{action}/mean_abs/{name}" for action in ("up", "down∕left") for name in names}
    assert set(per_unit) == expected | {"ig/action/up/greedy_states", "ig/action/down∕left/greedy_states"}
    expected_b = result.attributions[1, :, 1].abs().double().mean()  # action 1's Q, feature b, over the 6 states
    assert_close_scaled(per_unit["ig/action/down∕left/mean_abs/b"], expected_b, ulps=4, dtype=torch.float64)
    assert set(scalar_tags(tags, 10)) - set(metrics) <= {
        f"ig/drift/{name}" for name in ("spearman_prev", "spearman_first")
    }
    fewer = dataclasses.replace(tags, action_units=False)  # actions x units above max_logged_features
    assert {tag for tag in scalar_metrics(summary, fewer) if tag.startswith("ig/action/")} == {
        "ig/action/up/greedy_states",
        "ig/action/down∕left/greedy_states",
    }


def test_scalars_say_inf_for_non_finite_and_nan_for_unchecked():
    tags = TagNames.build(
        None, ["cart position", "pole/angle", "x2"], None, generated_features=False, generated_groups=False
    )
    metrics = scalar_metrics(make_summary(worst=math.inf, non_finite=2), tags)
    assert "ig/completeness/worst_relative_error" not in metrics  # the old ratio is never plotted
    assert metrics["ig/completeness/non_finite_states"] == 2.0
    assert metrics["ig/mean_abs/pole∕angle"] == 25.0 and metrics["ig/mean_signed/pole∕angle"] == -25.0
    assert metrics["ig/drift/spearman_prev"] == 0.5
    fixed = dataclasses.replace(make_summary(), drift={"spearman_prev": 0.5, "topk_jaccard_prev": 1.0})
    assert "ig/drift/topk_jaccard_prev" not in scalar_metrics(fixed, tags)  # 3 units, top_k 10: 1 by construction
    counts = {f"ig/{name}" for name in COUNT_TAGS}  # logged from their first non-zero run, not in scalar_tags
    assert set(metrics) - {"ig/drift/spearman_prev"} - counts <= set(scalar_tags(tags, top_k=10))
    named = TagNames.build("value", None, ["a", "b", "c"], generated_features=False, generated_groups=False)
    assert scalar_metrics(make_summary(groups=True), named)["ig/value/group/mean_abs/b"] == 25.0


def test_pictures_share_their_cadence_and_a_changed_verdict_gets_its_own_card():
    import dataclasses

    from lightning_ig.views.loggers.outputs import pictures_due
    from tests.support.summaries import make_summary

    cadences = {"verdict": 10, "shares": 10, "saliency": 10}
    never = dict.fromkeys(cadences)

    def due(index: int, **options) -> set[str]:
        summary = dataclasses.replace(make_summary(), run_index=index, step=100 * index)
        drawn = options.pop("drawn", never)
        return {
            kind
            for kind, draw in pictures_due(options.pop("cadences", cadences), drawn, summary, **options).items()
            if draw
        }

    assert due(0, final=False) == {"verdict", "shares", "saliency"}  # the first run draws every kind
    on_cadence = {index: due(index, final=False) for index in range(1, 20)}
    assert {index for index, kinds in on_cadence.items() if kinds} == {3, 6, 10, 13, 16}  # spread: 0, 3, 6 (+10)
    assert on_cadence[3] == {"shares"} and on_cadence[6] == {"saliency"} and on_cadence[10] == {"verdict"}
    assert due(7, final=False, verdict_due=True) == {"verdict"}  # between cards: a changed verdict is drawn
    assert due(7, final=True) == {"verdict", "shares", "saliency"}  # the end of training draws every kind
    assert due(7, final=True, drawn=dict.fromkeys(cadences, 700)) == set()  # never twice at one step
    assert due(7, final=True, verdict_due=True, cadences={"verdict": None, "shares": 10}) == {"shares"}
