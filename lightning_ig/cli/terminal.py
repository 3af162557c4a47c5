"""What the command prints is text, never terminal commands: control characters from files are escaped.

A report, a checkpoint's metadata or a path can hold characters a terminal obeys (``ESC ]0;...BEL`` retitles the
window, U+202E shows text backwards, a lone surrogate makes ``print`` fail): every line printed from a file's
contents goes through :func:`printable`, which writes each as a Python-style escape.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls and DEL, C1 controls, the line and paragraph separators, the bidirectional marks, embeddings,
# overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069), and lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: object) -> str:
    """``str(text)`` with every character a terminal would act on written as an escape (``\\x1b``, ``\\u202e``).

    Example::

        >>> printable("a\\x1b]0;title\\x07b")
        'a\\\\x1b]0;title\\\\x07b'
    """
    return _UNSAFE.sub(_escape, str(text))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
