"""Sizes written for people: what a plan's reason or a log line says about memory.

A reason is read by an operator in `tail` and the console, not parsed: "memory 400 MiB
from peak 333 MiB" says what "memory 419625370 B from peak 349687808 B" hides. The exact
numbers stay in the plan's fields.
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units, three significant digits: ``400 MiB``, ``1.5 GiB``."""
    value, unit = float(n), 0
    while abs(value) >= 1023.5 and unit < len(_UNITS) - 1:  # 1023.6 KiB reads "1 MiB"
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{value:.0f} B"
    digits = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{digits} {_UNITS[unit]}"


__all__ = ["human_bytes"]
