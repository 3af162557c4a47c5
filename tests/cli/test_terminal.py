"""What the command prints is text: every character a terminal would act on is written as an escape."""

from __future__ import annotations

from lightning_ig.cli.exits import one_line
from lightning_ig.cli.terminal import printable


def test_printable_escapes_what_a_terminal_obeys() -> None:
    assert printable("plain é ü 漢字 ✓") == "plain é ü 漢字 ✓"
    assert printable("a\x1b[2Jb\x07\x7f\x85\u202e\u2066\udc80") == "a\\x1b[2Jb\\x07\\x7f\\x85\\u202e\\u2066\\udc80"
    assert one_line("line\nbreak\x1b") == "line break\\x1b"
