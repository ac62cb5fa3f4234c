"""How long a loop waits after its n-th failure in a row: one policy for every retry.

Every retry loop of the project (services restarted by `up`, consumers, followers of a
topic, the informer, the brain's loops, the SDK's sender and config client) waits
``Backoff.delay(failures)`` and counts its failures itself, because what resets the count
differs (a good poll, a run that lasted, an acknowledged batch). The wait itself is the
caller's: ``dlrover_events.lifecycle.wait_or_stop`` where a stop must cut it short, a
threading.Event's ``wait`` in a thread. A library such as tenacity wraps a call; these
loops log once per outage, keep state between tries and stop on shutdown, which a
delay they compute fits better.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: a bound on the doubling's exponent, so a long outage cannot overflow a float
_MAX_DOUBLINGS = 60


@dataclass(frozen=True)
class Backoff:
    """Delays between tries: doubling from ``initial_s`` up to ``max_s``; with ``jitter``,
    each a random 50 % to 100 % of that (many clients of one broker or gateway, such as a
    job's pods, then do not all come back at the same instant)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    jitter: bool = False
    #: a run this long counts as healthy: the next failure starts the series again
    stable_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial_s <= self.max_s:
            raise ValueError(
                f"a backoff needs 0 <= initial_s <= max_s, got {self.initial_s} and {self.max_s}"
            )

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1: the first)."""
        doublings = min(max(0, failures - 1), _MAX_DOUBLINGS)
        base = float(min(self.max_s, self.initial_s * 2**doublings))
        return base * random.uniform(0.5, 1.0) if self.jitter else base

    def failures_after(self, failures: int, ran_s: float) -> int:
        """The count of failures in a row once a try that lasted ``ran_s`` failed: 1 again
        after a run of ``stable_s`` or more."""
        return 1 if ran_s >= self.stable_s else failures + 1


__all__ = ["Backoff"]
