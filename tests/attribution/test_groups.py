"""FeatureGroups: every accepted form, the bad forms, and group sums that equal their members' sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_ig import FeatureGroups
from lightning_ig.attribution import integrated_gradients
from tests.support.tolerance import assert_close_scaled


def _member_sums(groups: FeatureGroups, attributions: torch.Tensor) -> torch.Tensor:
    flat = attributions.reshape(attributions.shape[0], -1).double()
    return torch.stack([flat[:, groups.members(g)].sum(1) for g in range(len(groups))], dim=1)


def test_channels_of_an_image_state():
    groups = FeatureGroups.resolve("channels", (3, 4, 5))
    assert groups.names == ["channel 0", "channel 1", "channel 2"]
    assert groups.sizes.tolist() == [20, 20, 20]
    assert groups.ids.tolist() == [0] * 20 + [1] * 20 + [2] * 20
    attributions = torch.randn(6, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    sums = groups.sum(attributions)
    assert sums.shape == (6, 3) and sums.dtype == torch.float32
    assert_close_scaled(
        sums, attributions.double().sum((2, 3)), ulps=32, scale=float(attributions.abs().sum((2, 3)).max())
    )


def test_features_keep_the_feature_names_and_values():
    groups = FeatureGroups.resolve("features", (4,), names=["a", "b", "c", "d"])
    assert groups.names == ["a", "b", "c", "d"]
    attributions = torch.randn(3, 4)
    assert torch.equal(groups.sum(attributions), attributions)
    assert FeatureGroups.resolve("features", (2, 2)).names == ["x[0,0]", "x[0,1]", "x[1,0]", "x[1,1]"]


def test_integer_mask_captum_semantics_non_contiguous_ids_and_broadcast():
    mask = torch.tensor([[0, 0, 7], [2, 7, 2]])
    groups = FeatureGroups.resolve(mask, (2, 3))
    assert groups.names == ["group 0", "group 2", "group 7"]  # kept in id order, renumbered 0..G-1
    assert groups.ids.tolist() == [0, 0, 2, 1, 2, 1]
    assert groups.sizes.tolist() == [2, 2, 2]
    # Captum's leading batch dimension of 1, and a (H, W) mask shared by every channel
    assert torch.equal(FeatureGroups.resolve(mask[None], (2, 3)).ids, groups.ids)
    pixels = FeatureGroups.resolve(np.arange(4).reshape(2, 2), (3, 2, 2))
    assert pixels.sizes.tolist() == [3, 3, 3, 3]
    assert pixels.members(1).tolist() == [1, 5, 9]


def test_dict_of_index_lists_and_bool_masks_with_the_rest_as_other():
    shape = (2, 3)
    groups = FeatureGroups.resolve(
        {"first row": torch.tensor([[True, True, True], [False, False, False]]), "corner": [5]}, shape
    )
    assert groups.names == ["first row", "corner", "other"]
    assert groups.members(0).tolist() == [0, 1, 2] and groups.members(1).tolist() == [5]
    assert groups.members(2).tolist() == [3, 4]
    renamed = FeatureGroups.resolve({"a": [0, 1, 2, 3, 4, 5]}, shape, names=["everything"])
    assert renamed.names == ["everything"]


def test_group_sums_equal_member_sums_for_uneven_groups_and_are_repeatable():
    generator = torch.Generator().manual_seed(1)
    mask = torch.randint(0, 5, (3, 7, 7), generator=generator)
    groups = FeatureGroups.resolve(mask, (3, 7, 7))
    attributions = torch.randn(9, 3, 7, 7, generator=generator)
    sums = groups.sum(attributions)
    scale = float(attributions.abs().reshape(9, -1).sum(1).max())
    assert_close_scaled(sums, _member_sums(groups, attributions), ulps=64, scale=scale)
    assert torch.equal(sums, groups.sum(attributions))  # bit-identical repeat
    blocks = FeatureGroups.blocks((10,), 4)
    assert blocks.names == ["x0..x3", "x4..x7", "x8..x9"]
    assert_close_scaled(
        blocks.sum(attributions.reshape(9, -1)[:, :10]),
        _member_sums(blocks, attributions.reshape(9, -1)[:, :10]),
        ulps=16,
    )


def test_completeness_holds_per_group():
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(2 * 4 * 4, generator=generator)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x.reshape(x.shape[0], -1) @ weight)

    states = torch.randn(5, 2, 4, 4, generator=generator)
    result = integrated_gradients(forward, states, n_steps=64)
    groups = FeatureGroups.resolve("channels", (2, 4, 4))
    grouped = groups.sum(result.attributions).double()  # (B, G)
    # the groups add up to the features' total, so completeness per state is the same for groups
    total = result.attributions.reshape(5, -1).double().sum(1)
    assert_close_scaled(
        grouped.sum(1), total, ulps=64, scale=float(result.attributions.abs().reshape(5, -1).sum(1).max())
    )
    # ... so the groups' completeness gap is the engine's delta, up to the rounding of those sums
    difference = (result.f_input - result.f_baseline).double()
    scale = float((result.attributions.abs().reshape(5, -1).sum(1) + difference.abs()).max())
    assert_close_scaled(grouped.sum(1) - difference, result.delta.double(), ulps=64, scale=scale)


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        (
            torch.zeros(3, 3, dtype=torch.int64),
            ValueError,
            r"mask has shape \(3, 3\), which does not fit the feature shape \(2, 3\)",
        ),
        (torch.tensor([[0, -1, 0], [1, 1, 1]]), ValueError, "ids must be >= 0, got -1"),
        (torch.zeros(2, 3), TypeError, "must hold integer group ids, got dtype torch.float32"),
        (torch.zeros(2, 3, dtype=torch.bool), TypeError, "pass a dict"),
        ({"a": [0, 1], "b": []}, ValueError, r"feature_groups\['b'\] is empty"),
        ({"a": [0, 1], "b": [1, 2]}, ValueError, r"feature 1 is in feature_groups\['b'\] and in feature_groups\['a'\]"),
        ({"a": [0, 6]}, ValueError, "holds index 6, outside the 6 features"),
        ({"a": [0.5]}, TypeError, "list of flat feature indices or a bool mask"),
        # a config file's quoted indices, a nested list: not numbers, not an index outside (said so before)
        ({"a": ["0", "1"]}, TypeError, r"list of flat feature indices or a bool mask.*got \['0', '1'\]"),
        ({"a": [[0, 1], [2]]}, TypeError, r"list of flat feature indices or a bool mask.*got \[\[0, 1\], \[2\]\]"),
        ({1: [0]}, TypeError, "names must be strings"),
        ({}, ValueError, "empty dict"),
        ("pixels", ValueError, "must be 'features', 'channels', an integer mask or a dict, got 'pixels'"),
        (3.5, TypeError, "got float"),
    ],
)
def test_bad_forms_raise_one_clear_error(groups, error, match):
    with pytest.raises(error, match=match):
        FeatureGroups.resolve(groups, (2, 3))


def test_bad_names_and_channels_without_channels():
    with pytest.raises(ValueError, match="names repeats"):
        FeatureGroups.resolve("channels", (2, 3), names=["same", "same"])
    with pytest.raises(ValueError, match="names has 1 names but there are 2 groups"):
        FeatureGroups.resolve("channels", (2, 3), names=["one"])
    with pytest.raises(ValueError, match="needs states with a channel dimension"):
        FeatureGroups.resolve("channels", (6,))
    built = FeatureGroups.resolve("channels", (2, 3))
    with pytest.raises(ValueError, match=r"built for feature shape \(2, 3\), the states have \(3, 2\)"):
        FeatureGroups.resolve(built, (3, 2))
    with pytest.raises(ValueError, match="do not match the groups' feature shape"):
        built.sum(torch.zeros(4, 5))


def test_groups_know_whether_they_named_themselves():
    assert FeatureGroups.resolve("channels", (2, 3)).generated_names
    assert FeatureGroups.resolve(torch.tensor([0, 1, 1]), (3,)).generated_names
    assert FeatureGroups.blocks((8,), 4).generated_names
    assert not FeatureGroups.blocks((8,), 4, [f"f{i}" for i in range(8)]).generated_names
    assert not FeatureGroups.resolve({"a": [0]}, (3,)).generated_names
    assert not FeatureGroups.resolve("channels", (2, 3), names=["left", "right"]).generated_names
    assert not FeatureGroups.resolve("features", (2,), names=["joint 1", "joint 10"]).generated_names


def test_channel_names_only_when_the_groups_are_the_channels() -> None:
    named = FeatureGroups.resolve("channels", (3, 2, 2), names=["paddle", "ball", "brick"])
    assert named.channel_names() == ["paddle", "ball", "brick"]
    by_dict = FeatureGroups.resolve({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, (2, 2, 2))
    assert by_dict.channel_names() == ["a", "b"]  # the same partition, by indices
    swapped = FeatureGroups.resolve({"b": [4, 5, 6, 7], "a": [0, 1, 2, 3]}, (2, 2, 2))
    assert swapped.channel_names() is None  # group 0 is channel 1: tiles would be mislabelled
    assert FeatureGroups.resolve("features", (2, 2, 2)).channel_names() is None
    assert FeatureGroups.resolve("features", (4,)).channel_names() is None  # a flat vector has no channels
    # (T, C, H, W): the pictures' channels are the T * C frames, not the T groups of dim 0
    assert FeatureGroups.resolve("channels", (2, 3, 4, 5)).channel_names() is None


@pytest.mark.parametrize(
    ("groups", "shape", "names", "match"),
    [
        (torch.tensor([0, 0, 1, 1]), (4,), ["a", "b", "c"], "names has 3 names but there are 2 groups"),
        ("channels", (3, 2, 2), ["r", "g", "b", "alpha"], "names has 4 names but there are 3 groups"),
        ({"a": [0, 1]}, (4,), ["a", "rest", "more"], "names has 3 names but there are 2 groups"),
    ],
)
def test_more_names_than_groups_make_no_phantom_group(groups, shape, names, match):
    # guards against: FeatureGroups.resolve(torch.tensor([0, 0, 1, 1]), (4,), ["a", "b", "c"]).sizes == [2, 2, 0]
    with pytest.raises(ValueError, match=match):
        FeatureGroups.resolve(groups, shape, names)


def test_ids_that_skip_a_group_are_refused():
    with pytest.raises(ValueError, match="ids leave group 1 without a feature"):
        FeatureGroups(torch.tensor([0, 0, 2, 2]), ["a", "b", "c"], (4,))


@pytest.mark.parametrize("index", [2**70, -(2**70), 2**63])
def test_an_index_past_int64_is_a_value_error(index):
    # guards against: OverflowError (a bug's exit status on the command line)
    with pytest.raises(ValueError, match=r"feature_groups\['a'\] holds an index outside the 4 features"):
        FeatureGroups.resolve({"a": [0, index]}, (4,))


def test_sum_refuses_attributions_of_another_feature_shape_with_as_many_features():
    """(B, 3, 2) attributions against (2, 3) groups used to be summed as if (2, 3): wrong channels, nothing said."""
    groups = FeatureGroups.resolve("channels", (2, 3))
    with pytest.raises(ValueError, match=r"attributions of shape \(4, 3, 2\) do not match the groups' feature shape"):
        groups.sum(torch.ones(4, 3, 2))
    assert torch.equal(groups.sum(torch.ones(4, 2, 3)), groups.sum(torch.ones(4, 6)))  # (B, C, L) or flat (B, F)
    assert torch.equal(groups.sum(torch.ones(1, 6)), torch.full((1, 2), 3.0))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64, np.uint32, np.uint64])
def test_unsigned_integer_masks_are_group_ids(dtype):
    # guards against: NotImplementedError "min_all" not implemented for 'UInt16' (and wider)
    ids = [0, 3, 3, 1]
    mask = np.array(ids, dtype=dtype) if isinstance(dtype, type) else torch.tensor(ids, dtype=dtype)
    groups = FeatureGroups.resolve(mask, (4,))
    assert groups.names == ["group 0", "group 1", "group 3"] and groups.ids.tolist() == [0, 2, 2, 1]


def test_the_leftover_group_takes_a_name_no_user_group_has():
    groups = FeatureGroups.resolve({"other": [0], "other features": [1]}, (4,))
    assert groups.names == ["other", "other features", "other 2"] and groups.members(2).tolist() == [2, 3]


@pytest.mark.parametrize("groups", [{"a": [0, 2], "b": [1]}, torch.tensor([0, 1, 0, 1]), "features"])
def test_an_empty_batch_sums_to_no_rows(groups):
    # guards against: RuntimeError min(): Expected reduction dim to be specified (segment_reduce of 0 rows)
    built = FeatureGroups.resolve(groups, (4,))
    assert built.sum(torch.zeros(0, 4)).shape == (0, len(built))


def test_names_of_another_count_than_the_groups_list_the_groups():
    """A dict that leaves a feature out has one group more, ``other``: the count's message names the groups, so that
    group_names=['A', 'B'] for {'a': ..., 'b': ...} is not told '3 groups' without which."""
    groups = FeatureGroups.resolve({"a": [0, 1], "b": [2]}, (4,))
    with pytest.raises(ValueError, match=r"2 names but there are 3 groups \['a', 'b', 'other'\]"):
        groups.renamed(["A", "B"], "group_names")


def test_a_list_of_bools_is_told_to_become_a_mask():
    """A dict's bool mask must be a tensor or array; a list of bools is refused (it is no index list either), and the
    message says how to make it one (it read 'must be ... a bool mask ..., got [True, False, True, False]')."""
    with pytest.raises(
        TypeError, match=r"a bool mask of the feature shape, a tensor or array \(torch.tensor of a list of bools\)"
    ):
        FeatureGroups.resolve({"a": [True, False, True, False]}, (4,))
