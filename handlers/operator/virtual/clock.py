"""Simulated time against wall time, for a virtual env's operator.

At a speed-up the simulated clock is a linear function of the wall clock, so a replay fed
at the same speed-up lines up with it; as fast as possible, it has no relation to the wall
clock at all and moves only when the operator jumps it to the next event.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SimClock:
    def __init__(self, speed: float | None, *, wall: Callable[[], float] = time.monotonic) -> None:
        if speed is not None and speed <= 0:
            raise ValueError("a simulated clock runs forwards: speed must be > 0")
        self.speed = speed
        self._wall = wall
        self._sim0 = 0.0
        self._wall0 = wall()

    @property
    def fast(self) -> bool:
        return self.speed is None

    def start(self, sim: float = 0.0) -> None:
        """Simulated time ``sim`` is now; it runs on from here."""
        self._sim0, self._wall0 = sim, self._wall()

    def now(self) -> float | None:
        """The simulated second it is; None when only the operator moves the clock."""
        if self.speed is None:
            return None
        return self._sim0 + (self._wall() - self._wall0) * self.speed

    def wall_seconds(self, sim_seconds: float) -> float:
        """How long to wait for that many simulated seconds to pass (0 when fast)."""
        return 0.0 if self.speed is None else max(0.0, sim_seconds / self.speed)
