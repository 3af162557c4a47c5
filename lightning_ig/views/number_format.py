"""How the pictures and the text write numbers: ``1.09`` (never ``1.09e+00``), ``3.8e-05``, ``0.3%``, ``<0.01%``.

One writer per kind of number, used by every picture and by the run's text, so that a value reads the same
in a chart, under a saliency tile and in the report:

* :func:`format_value`: an attribution, a target value, a colour scale's end: three significant digits,
  plain decimals between 0.001 and 100000, scientific notation outside (where plain decimals would need
  a run of zeros);
* :func:`format_signed`: the same with its sign always written (``+0.85``, ``-1.2``): a change such as
  ``F(x) - F(b)``;
* :func:`format_percent`: a share (a fraction of 1) as a percentage; a share too small to show in two
  decimals is written ``<0.01%``, never ``0.00%``, which would read as exactly nothing.
"""

from __future__ import annotations

import math

__all__ = ["format_percent", "format_signed", "format_value"]

_PLAIN_LOW = 1e-3  # below this, plain decimals need leading zeros: 0.000123 reads worse than 1.23e-04
_PLAIN_HIGH = 1e5
_SMALLEST_PERCENT = 0.01  # the smallest percentage written out; anything above zero and below it is "<0.01%"


def format_value(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits: ``1.09``, ``0.0123``, ``12300``, ``3.8e-05``.

    Args:
        value: any float; ``nan`` and ``inf`` are written as such.
        digits: significant digits (default 3).

    Returns:
        Plain decimals for ``1e-3 <= |value| < 1e5`` (trailing zeros dropped), else scientific notation with
        two exponent digits; ``"0"`` for zero.

    Example::

        >>> [format_value(v) for v in (1.0904, 0.012345, -0.5, 123456.0, 3.8e-05, 0.0)]
        ['1.09', '0.0123', '-0.5', '1.23e+05', '3.8e-05', '0']
    """
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if _PLAIN_LOW <= magnitude < _PLAIN_HIGH:
        rounded = float(f"{value:.{digits}g}")  # 3 significant digits, then as plain decimals
        if abs(rounded) >= _PLAIN_HIGH:  # 99999.7 rounds up past the plain range
            return _scientific(value, digits)
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
        text = f"{rounded:.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return _scientific(value, digits)


def _scientific(value: float, digits: int) -> str:
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


def format_signed(value: float, digits: int = 3) -> str:
    """:func:`format_value` with the sign always written: ``+0.85``, ``-1.2``, ``0``.

    Example::

        >>> format_signed(0.853), format_signed(-1.2), format_signed(0.0)
        ('+0.853', '-1.2', '0')
    """
    text = format_value(value, digits)
    return f"+{text}" if math.isfinite(value) and value > 0 else text


def format_percent(fraction: float, digits: int = 3) -> str:
    """A share written as a percentage: ``31.4%``, ``0.25%``, ``<0.01%``, ``0%``, ``100%``.

    Args:
        fraction: the share, ``0.314`` for 31.4%.
        digits: significant digits (default 3), but never more decimals than two.

    Returns:
        The percentage; above zero but below 0.01% it is ``"<0.01%"`` (a tiny error is never ``0.00%``).

    Example::

        >>> [format_percent(v) for v in (0.31416, 0.0025, 3e-07, 0.0, 1.0)]
        ['31.4%', '0.25%', '<0.01%', '0%', '100%']
    """
    if not math.isfinite(fraction):
        return f"{fraction}%"
    percent = 100.0 * fraction
    if percent == 0:
        return "0%"
    if 0 < abs(percent) < _SMALLEST_PERCENT:
        return "<0.01%" if percent > 0 else ">-0.01%"
    decimals = min(2, max(0, digits - 1 - math.floor(math.log10(abs(percent)))))
    text = f"{percent:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"
