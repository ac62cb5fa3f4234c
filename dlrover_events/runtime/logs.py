"""Logging of every command and service: the level, the format, and the fields a line
carries. The one place that sets logging up (`configure`, called by the CLI's root).

- Level: `--log-level` or `DLROVER_EVENTS_LOG_LEVEL`; without either, WARNING for a
  short command (its output is its answer) and INFO for a long-running one (`up`, a
  service run alone: `for_service`), so an operator sees what a service did ("created
  pod ...", "plan ... applied") without asking.
- Format: `DLROVER_EVENTS_LOG_FORMAT` (or `--log-format`): `text` (default, for people) or
  `json`: one JSON object a line with `timestamp` (RFC 3339, UTC), `level`, `logger`,
  `message`, and `env`, `service`, `job`, `plan_id` where known (and `exception`).
- Fields: known from where the line is logged, never parsed out of its text. A service's
  task runs inside `log_fields(env=..., service=...)` (`up`'s supervisor, `standalone`);
  the work on one job or plan inside `log_fields(job=..., plan_id=...)`; one line may
  name its own with `extra={"job": ...}`. Context variables follow asyncio tasks, so a
  task started inside a service's fields logs with them.

Third-party libraries stay at WARNING below DEBUG (faust and aiokafka tell every
rebalance and connection at INFO); aiokafka's refused connections, logged at ERROR on
every retry, are left out: our own error line says it once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import orjson

LEVEL_ENV = "DLROVER_EVENTS_LOG_LEVEL"
FORMAT_ENV = "DLROVER_EVENTS_LOG_FORMAT"

#: The fields a line may carry, in the order a text line shows them.
FIELDS = ("env", "service", "job", "plan_id")


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


#: Libraries that say too much at INFO; WARNING for them unless the level is DEBUG.
CHATTY = ("faust", "mode", "aiokafka", "aiohttp.access", "kubernetes_asyncio", "asyncio")


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


_NONE: Mapping[str, str] = MappingProxyType({})
_fields: ContextVar[Mapping[str, str]] = ContextVar("dlrover_events_log_fields", default=_NONE)


@contextlib.contextmanager
def log_fields(**fields: str | None) -> Iterator[None]:
    """Lines logged inside (and by tasks started inside) carry these fields; None leaves
    a field as it was."""
    _install()
    given = {k: v for k, v in fields.items() if v is not None}
    token = _fields.set(MappingProxyType({**_fields.get(), **given}))
    try:
        yield
    finally:
        _fields.reset(token)


def current_fields() -> Mapping[str, str]:
    return _fields.get()


def line_fields(record: logging.LogRecord) -> dict[str, str]:
    """The fields of one line: those of where it was logged, then its own (`extra=`)."""
    found = dict(getattr(record, "context_fields", {}))
    for name in FIELDS:
        value = record.__dict__.get(name)
        if value is not None:
            found[name] = str(value)
    return {name: found[name] for name in FIELDS if name in found}


_base_factory = logging.getLogRecordFactory()


def _record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """Every record takes the fields of where it is made (the caller's context), under
    one attribute of its own: `extra=` may still name any field."""
    record = _base_factory(*args, **kwargs)
    record.context_fields = _fields.get()
    return record


def _install() -> None:
    """Records take the fields from now on (the first `log_fields`, or `configure`)."""
    if logging.getLogRecordFactory() is not _record_factory:
        global _base_factory
        _base_factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_record_factory)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger [env=... service=... job=...]: message`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(where)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = line_fields(record)
        record.where = (
            " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]" if fields else ""
        )
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: what a log collector indexes without a parser."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **line_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class _Setup:
    """What `configure` chose: `for_service` raises the default level only if no level
    was given."""

    given = False
    handler: logging.Handler | None = None


def configure(level: LogLevel | str | None = None, fmt: LogFormat | str | None = None) -> None:
    """Set logging up for this process: `level` and `fmt` as given (the CLI's root options,
    which read `DLROVER_EVENTS_LOG_LEVEL` and `DLROVER_EVENTS_LOG_FORMAT`), else WARNING
    and text. Called again, it changes them (the CLI sets a default before it parses its
    options). ValueError for a level or format that is none."""
    chosen = LogLevel(level.upper()) if level is not None else LogLevel.WARNING
    form = LogFormat(fmt.lower()) if fmt is not None else LogFormat.TEXT
    _Setup.given = level is not None
    _install()
    root = logging.getLogger()
    if _Setup.handler is not None:
        root.removeHandler(_Setup.handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form is LogFormat.JSON else TextFormatter())
    root.addHandler(handler)
    _Setup.handler = handler
    _set_level(chosen)


def for_service() -> None:
    """A long-running command (`up`, a service run alone) logs at INFO unless a level was
    given."""
    if not _Setup.given:
        _set_level(LogLevel.INFO)


def _set_level(level: LogLevel) -> None:
    logging.getLogger().setLevel(level.value)
    debug = level is LogLevel.DEBUG
    for name in CHATTY:
        logging.getLogger(name).setLevel(
            level.value if debug else max(logging.WARNING, logging.getLevelName(level.value))
        )
    if not debug:  # refused connections at ERROR on every retry; our own line says it once
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


__all__ = [
    "FIELDS",
    "FORMAT_ENV",
    "LEVEL_ENV",
    "JsonFormatter",
    "LogFormat",
    "LogLevel",
    "TextFormatter",
    "configure",
    "current_fields",
    "for_service",
    "line_fields",
    "log_fields",
]
