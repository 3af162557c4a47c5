"""callback/setup.py: what set-up decides once per fit: unique names, the units logged, the report folder."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig._files import OutputPathError
from lightning_ig.callback import setup


def test_two_callbacks_with_one_name_are_refused_and_distinct_names_pass() -> None:
    setup.check_unique_names([None, "value", "action_1"])
    with pytest.raises(MisconfigurationException, match="2 IntegratedGradientsCallbacks would write the same tags"):
        setup.check_unique_names(["value", None, "value"])


def test_features_are_logged_one_by_one_up_to_the_limit_then_in_groups() -> None:
    few = setup.logged_units((4,), None, ["a", "b", "c", "d"], None, None, max_features=64)
    assert few.log_features and few.groups is None and few.names == ["a", "b", "c", "d"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frames = setup.logged_units((4, 10, 10), "pix", None, None, None, max_features=64)
    assert not frames.log_features and frames.groups is not None and len(frames.groups) == 4  # the channels
    assert any("400 features" in str(warning.message) for warning in caught)


def test_the_warning_names_the_first_automatic_group_as_its_tag_does() -> None:
    # guards against: the set-up warning naming a generated group unpadded ('x0..x1') while its tags, the charts and
    # the text read 'x00..x01' (docs/tensorboard-tags.md: names appear the same everywhere), so the name it gave was
    # not found in TensorBoard
    for shape, first in [((70,), "x00..x01"), ((12, 2, 3), "channel 00")]:
        with pytest.warns(UserWarning, match="more than max_logged_features") as caught:
            units = setup.logged_units(shape, None, None, None, None, max_features=64)
        assert units.tags.labels["groups"][0] == first
        assert f"groups ({first}, ...) under ig/group/" in str(caught[0].message)


def test_automatic_groups_are_channels_or_consecutive_blocks() -> None:
    assert len(setup.automatic_groups((3, 8, 8), max_features=16)) == 3
    blocks = setup.automatic_groups((100,), max_features=16)
    assert len(blocks) <= 16 and sum(len(blocks.members(group)) for group in range(len(blocks))) == 100


def test_group_names_need_groups() -> None:
    with pytest.raises(ValueError, match="group_names needs feature_groups"):
        setup.choose_groups(None, (4,), group_names=["a"], feature_names=None, max_features=64)


def test_a_history_of_other_units_or_states_is_started_afresh() -> None:
    # guards against: a resume with other feature names or held-out states (of the same count) continuing the history,
    # so that drift compared unlike units by position
    now = {"units": 4, "names": ["a", "b", "c", "d"], "shape": [37, 4], "values": 12345}  # FitPlan.identity's
    kept = [{"mean_abs": [1.0, 2.0, 3.0, 4.0]}]
    assert setup.history_to_continue(kept, now, {"held_out": dict(now)}, None) is kept
    assert setup.history_to_continue(kept, now, {}, None) is kept  # an earlier version's checkpoint: counted only
    assert setup.history_to_continue([], now, {"held_out": {**now, "values": 1}}, None) == []  # nothing to say
    for was, differ in [
        (None, "units"),  # an earlier version's checkpoint of another count
        ({**now, "names": ["d", "c", "b", "a"]}, "names"),
        ({**now, "values": 54321}, "values"),
        ({**now, "shape": [20, 4], "values": 1}, "shape and values"),
    ]:
        history = kept if was else [{"mean_abs": [1.0, 2.0]}]
        with pytest.warns(
            UserWarning, match=rf"'v': .* held-out states \(their {differ} differ\); starting a new"
        ) as seen:
            assert setup.history_to_continue(history, now, {"held_out": was}, "v") == []
        assert len(seen) == 1


def test_without_a_logger_or_report_dir_the_reports_go_to_ig_reports(tmp_path: Path) -> None:
    folder = setup.report_folder(None, tmp_path, has_loggers=False, name=None, states=None)
    assert folder is not None and folder.folder == tmp_path / "ig_reports"
    assert setup.report_folder(None, tmp_path, has_loggers=True, name=None, states=None) is None


def test_a_reports_folder_the_user_never_named_is_not_blamed_on_report_dir(tmp_path: Path) -> None:
    # guards against: "report_dir '<root>/ig_reports' cannot be created" for a fit given no report_dir (no logger, a
    # default_root_dir that cannot hold a folder)
    root = tmp_path / "a_file"
    root.write_text("")
    told = r"the reports' folder \(no logger and no report_dir: give the callback a report_dir, the Trainer a logger"
    with pytest.raises(OutputPathError, match=told + r".*\) .*cannot be") as e:
        setup.report_folder(None, root, has_loggers=False, name=None, states=None)
    assert not str(e.value).startswith("report_dir")
    with pytest.raises(OutputPathError, match="^report_dir "):
        setup.report_folder(root / "given", tmp_path, has_loggers=False, name=None, states=None)
