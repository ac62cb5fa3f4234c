"""Keeping aiokafka's own log lines out of a training log, for the reporter's thread only.

During a broker outage aiokafka logs every failed connection, metadata refresh and produce
response (55 to 212 lines in 5 s, measured), which buries the training's own output. The
reporter already says what matters in one line per outage, so the records aiokafka logs
*from a reporter's thread* are held back (and counted). The filter sits on aiokafka's
loggers because a logger's filters are the only hook that sees a record before any handler
of the application does; it is scoped by thread so that an application using aiokafka for
itself, in any other thread, keeps every line it had. ``DLROVER_EVENTS_SDK_KAFKA_LOGS=show``
(or ``Reporter(quiet_kafka=False)``) lets them all through, for debugging the SDK.
"""

from __future__ import annotations

import logging
import os
import threading

#: ``quiet`` (default): aiokafka's lines from the reporter's thread are held back;
#: ``show``: they reach the application's handlers as they would without the SDK.
KAFKA_LOGS_ENV = "DLROVER_EVENTS_SDK_KAFKA_LOGS"
_ROOT = "aiokafka"


class ThreadLogFilter(logging.Filter):
    """Drops the records logged from registered threads; counts them per thread."""

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        ident = record.thread
        if ident is None or ident not in self._held:
            return True
        with self._lock:
            if ident in self._held:
                self._held[ident] += 1
                return False
        return True

    def register(self, ident: int) -> None:
        with self._lock:
            self._held.setdefault(ident, 0)

    def unregister(self, ident: int) -> int:
        """Stop holding back this thread's records; returns how many were held back."""
        with self._lock:
            return self._held.pop(ident, 0)

    def held(self, ident: int) -> int:
        return self._held.get(ident, 0)


#: One filter for the process: logging's configuration is process-wide by nature.
KAFKA_FILTER = ThreadLogFilter()


def kafka_logs_quiet(environ: dict[str, str] | None = None) -> bool:
    """What ``DLROVER_EVENTS_SDK_KAFKA_LOGS`` asks for; a bad value is a one-line error."""
    raw = (os.environ if environ is None else environ).get(KAFKA_LOGS_ENV, "").strip().lower()
    if raw in ("", "quiet"):
        return True
    if raw == "show":
        return False
    raise ValueError(f"{KAFKA_LOGS_ENV} must be 'quiet' or 'show', got {raw!r}")


def install(log_filter: logging.Filter = KAFKA_FILTER) -> None:
    """Put the filter on every aiokafka logger that exists (idempotent).

    A record is checked only by the filters of the logger it was logged on, not by its
    parents', so each of aiokafka's module loggers gets it; the SDK imports aiokafka (and
    so creates them) before it calls this.
    """
    manager = logging.Logger.manager
    names = [n for n in list(manager.loggerDict) if n == _ROOT or n.startswith(_ROOT + ".")]
    for name in [_ROOT, *names]:
        logger = logging.getLogger(name)
        if log_filter not in logger.filters:
            logger.addFilter(log_filter)
