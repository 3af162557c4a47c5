"""JSON from users' files parsed with bounds: every malformed input is one ``ValueError`` that says what was wrong."""

from __future__ import annotations

import json

import pytest

from lightning_ig._json import MAX_DEPTH, MAX_INT_DIGITS, parse_json


def test_ordinary_json_parses_as_json_loads_does() -> None:
    text = '{"states": [[1, -2.5e-3], [0, 1e300]], "names": ["a", "\\u00e9"], "seed": -9223372036854775808}'
    assert parse_json(text) == json.loads(text)
    assert parse_json(text.encode()) == json.loads(text)


def test_a_key_named_twice_is_refused_not_overwritten() -> None:
    with pytest.raises(ValueError, match="names the key 'states' twice"):
        parse_json('{"states": [1], "other": {"states": 2, "x": 1}, "states": [2]}')
    assert parse_json('{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}  # one key per object


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' * 50_000, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)])
def test_nesting_past_the_limit_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=f"nested deeper than the {MAX_DEPTH} levels"):
        parse_json(text)


def test_nesting_at_the_limit_parses() -> None:
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(text) == json.loads(text)


def test_integers_longer_than_the_limit_are_refused() -> None:
    assert parse_json("9" * MAX_INT_DIGITS) == int("9" * MAX_INT_DIGITS)
    assert parse_json("-" + "9" * MAX_INT_DIGITS) == -int("9" * MAX_INT_DIGITS)  # the sign is not a digit
    with pytest.raises(ValueError, match=f"an integer of {MAX_INT_DIGITS + 1} digits"):
        parse_json("[" + "9" * (MAX_INT_DIGITS + 1) + "]")


def test_text_that_is_not_json_is_a_value_error() -> None:
    with pytest.raises(json.JSONDecodeError):  # a ValueError
        parse_json("{")
    assert issubclass(json.JSONDecodeError, ValueError)


def test_a_byte_order_mark_is_skipped_as_windows_editors_write_it() -> None:
    # json.loads refuses it ("Unexpected UTF-8 BOM"): a report or states file saved by Notepad would not read
    assert parse_json(b'\xef\xbb\xbf{"states": [[1.0, 2.0]]}') == {"states": [[1.0, 2.0]]}
    assert parse_json("\ufeff[1, 2]") == [1, 2]
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        parse_json(b"\xef\xbb\xbf")  # a mark and nothing else is still not JSON
