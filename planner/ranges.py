"""Range checks for the numbers users type (command-line flags and config fields).

Every check names the field as the user wrote it (``--global-batch``, not an internal path), says
the allowed range and refuses NaN, infinities and booleans, so an out-of-range value is one clear
line and never silently accepted or turned into a late failure.
"""

from __future__ import annotations

import math
from typing import Any

from planner.errors import SpecError


def shown_int(value: int) -> str:
    """An integer as a message shows it: in full up to 12 digits, else its order of magnitude (a
    float cannot hold 10**400, and Python refuses to print integers of more than 4,300 digits)."""
    if abs(value) < 10**12:
        return str(value)
    return f"{'-' if value < 0 else ''}~1e{round((abs(value).bit_length() - 1) * math.log10(2))}"


def shown(value: Any) -> str:
    """Any value as a message shows it: integers by :func:`shown_int`, anything else by a short repr."""
    if isinstance(value, int) and not isinstance(value, bool):
        return shown_int(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int(field: str, value: Any, low: int, high: int, hint: str = "") -> int:
    """``value`` if it is an integer in ``[low, high]``, else a ``SpecError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(field, f"must be an integer in [{low:,}, {high:,}], got {shown(value)}",
                        hint or f"pass a whole number from {low:,} to {high:,}")
    return value


def check_number(field: str, value: Any, low: float | None = None, high: float | None = None, *,
                 above: bool = False, unit: str = "", hint: str = "") -> float:
    """``value`` as a float if it is finite and in range: ``> low`` with ``above``, else ``>= low``;
    ``<= high``. Otherwise a ``SpecError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"must be a number{unit}, got {shown(value)}", hint or "pass a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise SpecError(field, f"must be a finite number{unit}, got {shown(value)}",
                        hint or "pass a finite number")
    if low is not None and (number <= low if above else number < low):
        raise SpecError(field, f"must be {'>' if above else '>='} {low:g}{unit}, got {number:g}",
                        hint or f"pass a value {'above' if above else 'of at least'} {low:g}")
    if high is not None and number > high:
        raise SpecError(field, f"must be <= {high:g}{unit}, got {number:g}", hint or f"pass at most {high:g}")
    return number
