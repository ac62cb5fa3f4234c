"""Quantities written for and by people: sizes in what a plan's reason says, and the one
syntax of durations and speed-ups that every command takes.

A reason is read by an operator in `tail` and the console, not parsed: "memory 400 MiB
from peak 333 MiB" says what "memory 419625370 B from peak 349687808 B" hides. The exact
numbers stay in the plan's fields.

A duration on a command line is `30s`, `10m`, `1.5h`, `2d`, `500ms` or bare seconds (`90`);
a speed-up is `100x` or `100`, the same for `operator`, `replay` and `ab run`
(dlrover_events.cli.params turns both into option types).
"""

from __future__ import annotations

import math
import re

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


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$", re.ASCII)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_HINT = "a duration like 30s, 10m, 1.5h, 2d or seconds (90)"


def parse_duration(text: str) -> float:
    """``30s``, ``10m``, ``1.5h``, ``2d``, ``1w``, ``500ms`` or bare seconds -> seconds (>= 0,
    finite); a ValueError says what is wanted."""
    m = _DURATION.match(text)
    seconds = float(m.group(1)) * _SECONDS[m.group(2) or "s"] if m else math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not {DURATION_HINT}")
    return seconds


SPEED_HINT = "a speed-up like 10x, 100x, 0.5x (or 100)"
_SPEED = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*[xX]?\s*$", re.ASCII)


def parse_speed(text: str) -> float:
    """``100x``, ``100`` or ``0.5x`` -> a positive, finite speed-up factor; a ValueError says
    what is wanted."""
    m = _SPEED.match(text)
    speed = float(m.group(1)) if m else math.nan
    if not (speed > 0 and math.isfinite(speed)):
        raise ValueError(f"{text!r} is not {SPEED_HINT}: a positive number")
    return speed


__all__ = ["DURATION_HINT", "SPEED_HINT", "human_bytes", "parse_duration", "parse_speed"]
