"""Small numeric helpers the optimizers share."""

from __future__ import annotations

import math
from collections.abc import Iterable

MiB = 1024**2
GiB = 1024**3


def mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def median(values: Iterable[float]) -> float:
    items = sorted(values)
    if not items:
        return 0.0
    mid = len(items) // 2
    return items[mid] if len(items) % 2 else (items[mid - 1] + items[mid]) / 2


def ceil_int(value: float) -> int:
    """Ceiling that forgives float noise (0.1 * 3 / 0.3 must not become 2).

    A value that is not finite (a parameter such as a factor of 1e308 times a bounded
    use) is a ValueError that says so, not Python's OverflowError about converting an
    infinity, which told a user nothing about their input."""
    if not math.isfinite(value):
        raise ValueError(f"a computed value is {value}: a parameter or state value out of range")
    return math.ceil(round(value, 9))


def ceil_to(value: int, unit: int) -> int:
    """``value`` rounded up to a whole number of ``unit`` (never below it)."""
    return -(-value // unit) * unit
