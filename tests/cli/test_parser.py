"""cli/parser.py: every typed flag refuses a wrong value with exit status 2 and one line naming the flag, before
anything is loaded (one table: what each flag takes)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator

import pytest

from lightning_ig.cli import main
from lightning_ig.cli.parser import build_parser
from lightning_ig.vocabulary import TARGET_NAMES

_WRONG_TEXT = ["abc", "", "1.5", "-5", "nan", "inf", "1e400", "9" * 5000, "[" * 100000, '{"a": ' * 50000]
# int() and float() read these as 10, 3, 3 and 3 (--target 1_0 was action 10): a number is typed in digits 0-9
_WRONG_TEXT += ["1_0", " 3", "+3", "\u0663"]


def _whole(text: str, low: int) -> bool:
    """A whole number >= ``low`` that a count or an index can be (up to 2**63 - 1)."""
    return text.isascii() and text.isdigit() and len(text) < 19 and int(text) >= low


def _positive_real(text: str) -> bool:
    """A finite number > 0 as typed: digits 0-9, a point, an exponent (not float()'s " 3", "+3", "1_0" or Arabic)."""
    plain = re.fullmatch(r"(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", text, re.ASCII | re.IGNORECASE)
    return plain is not None and math.isfinite(float(text)) and float(text) > 0


# What each typed flag takes; a new typed flag needs a line here (the first test says so).
ACCEPTS: dict[str, Callable[[str], bool]] = {
    "--auto-samples": lambda text: _whole(text, 1),
    "--top-k": lambda text: _whole(text, 1),
    "--top": lambda text: _whole(text, 1),
    "--internal-batch-size": lambda text: _whole(text, 1),
    "--worst-states": lambda text: _whole(text, 0),
    "--seed": lambda text: _whole(text, 0),
    "--num-steps": lambda text: text in ("auto", "budget") or _whole(text, 1),
    "--completeness-tol": _positive_real,
    "--target": lambda text: text in TARGET_NAMES or _whole(text.removeprefix("action:"), 0),
    "--model": lambda text: bool(re.fullmatch(r"[\w.]+:[\w.]+", text)),
    "--lightning-module": lambda text: bool(re.fullmatch(r"[\w.]+:[\w.]+", text)),
    "--model-kwargs": lambda text: text.startswith("{") and text.endswith("}"),
    "--verify": lambda text: _whole(text, 1),
    "--method": lambda text: False,  # none of the wrong texts is a rule's name
}


def _typed_flags() -> Iterator[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for command, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and (action.type is not None or action.choices is not None):
                yield command, action


def _cases() -> Iterator[object]:
    for command, action in _typed_flags():
        flag = max(action.option_strings, key=len)
        takes = ACCEPTS.get(flag, lambda text: False)
        for text in _WRONG_TEXT:
            if not (text in action.choices if action.choices is not None else takes(text)):
                label = text if len(text) < 12 else f"{text[:3]}...({len(text)} chars)"
                yield pytest.param(command, flag, text, id=f"{command}-{flag}-{label}")


def test_every_typed_flag_says_what_it_takes() -> None:
    flags = {max(action.option_strings, key=len) for _, action in _typed_flags() if action.choices is None}
    assert flags == set(ACCEPTS)


@pytest.mark.parametrize(("command", "flag", "text"), list(_cases()))
def test_a_wrong_flag_value_exits_2_naming_the_flag(
    command: str, flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    required = ["--checkpoint", "missing.safetensors"] if command == "diag" else ["missing.json"]
    status = main([command, *required, f"{flag}={text}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert flag in err and len(err.strip().splitlines()) == 1, err
    assert len(err) < 1000  # the value is quoted cut short, not 100000 characters of it


@pytest.mark.parametrize("value", ["-1", "action:-1", "1_0", "\u0663"])
def test_a_target_that_is_no_action_index_is_told_every_form_it_takes(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: --target=-1 said "an action index must be an int >= 0, got -1", naming neither the flag's other
    # forms nor how an index is written; --target 1_0 and Arabic digits were read as actions 10 and 3 by int()
    status = main(["diag", "--checkpoint", "missing.safetensors", f"--target={value}"])
    err = capsys.readouterr().err
    forms = "expected 'mean', 'each', 'contrast', an action index N or 'action:N' (N = 0, 1, 2, ... in digits 0-9)"
    assert status == 2 and f"--target: {forms}, got {value!r};" in err, err


@pytest.mark.parametrize("value", ["-inf", "-0.5e3"])
def test_a_value_that_looks_like_a_flag_is_told_to_use_equals(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["diag", "--checkpoint", "missing.safetensors", "--baseline", value])
    err = capsys.readouterr().err
    assert status == 2 and "--baseline: expected one argument (a value starting with '-': --baseline=VALUE)" in err, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["diag", "--checkpoint", "q.safetensors", "--verfy", "4"],
            "--verfy 4 (did you mean --verify?); see `lightning-ig diag --help`",
        ),
        (["show", "r.json", "--Top=3"], "--Top=3 (did you mean --top?); see `lightning-ig show --help`"),
        (
            ["diag", "--checkpoint", "q.safetensors", "extra"],
            "unrecognized arguments: extra; see `lightning-ig diag --help`",
        ),
    ],
)
def test_a_mistyped_flag_is_told_the_nearest_flag_and_its_commands_help(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "lightning-ig: error: unrecognized arguments: --verfy 4; see `lightning-ig --help`" (the
    # top-level help, which lists no flag of the command)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.strip().endswith(said), err


def test_the_help_names_every_spelling_that_target_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """--target takes action:N (the report's forward_target spelling, as its own error message lists) beside N, but
    --help showed only mean|N|each|contrast: each spelling the help names parses, and action:N is among them."""
    with pytest.raises(SystemExit):
        main(["diag", "--help"])
    metavar = re.search(r"^ +--target (\S+)$", capsys.readouterr().out, re.MULTILINE)  # the flag's own help
    assert metavar is not None and "action:N" in metavar[1].split("|"), metavar
    parser = build_parser()
    for spelling in metavar[1].split("|"):
        typed = spelling.replace("N", "2")
        assert parser.parse_args(["diag", "--checkpoint", "q.safetensors", "--target", typed]).target == typed


def test_the_help_screens_and_a_wrong_flag_load_neither_numpy_nor_torch() -> None:
    """`lightning-ig --help`, `diag --help` and a wrong flag answer at once: the parser's checks imported numpy
    (through lightning_ig.vocabulary), about two thirds of the help screen's 0.2 s."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from lightning_ig.cli import main\n"
        "for argv in (['--help'], ['diag', '--help'], ['show', '--help'], ['diag', '--num-steps', '0']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        with contextlib.suppress(SystemExit):\n"
        "            main(argv)\n"
        "print(sorted(name for name in ('numpy', 'torch') if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]", done
