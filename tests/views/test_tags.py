"""views/tags.py: the tags a callback logs and the labels in them."""

from __future__ import annotations

from lightning_ig.views.tags import display_labels


def test_labels_are_readable_and_generated_ones_sort_numerically():
    assert display_labels(["cart position", "pole/angle"]) == ["cart position", "pole∕angle"]
    labels = display_labels(["x[0,3,9]", "x[0,10,2]", "x[1,0,0]"], generated=True)
    assert labels == ["x[00,03,09]", "x[00,10,02]", "x[01,00,00]"] and sorted(labels) == labels
    assert display_labels(["channel 0", "channel 10", "channel 2"], generated=True) == [
        "channel 00",
        "channel 10",
        "channel 02",
    ]
