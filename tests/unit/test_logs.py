"""Logging set up in one place: levels, the two formats, and fields taken from where a
line is logged (context, tasks started there, `extra=`), never parsed from its text."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime

import pytest
from typer.testing import CliRunner

from dlrover_events.cli.app import app as cli
from dlrover_events.runtime import logs
from dlrover_events.runtime.logs import (
    JsonFormatter,
    LogFormat,
    TextFormatter,
    line_fields,
    log_fields,
)


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    """configure() changes the process's logging: put back what pytest had."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    chatty = {name: logging.getLogger(name).level for name in (*logs.CHATTY, "aiokafka")}
    yield
    if logs._Setup.handler is not None:
        root.removeHandler(logs._Setup.handler)
        logs._Setup.handler = None
    root.setLevel(level)
    root.handlers[:] = handlers
    for name, was in chatty.items():
        logging.getLogger(name).setLevel(was)
    logs._Setup.given = False


def _record(message: str = "created pod %s", *args: object, **extra: object) -> logging.LogRecord:
    return logging.getLogger("handlers.operator.reconcile.reconciler").makeRecord(
        "handlers.operator.reconcile.reconciler",
        logging.INFO,
        __file__,
        1,
        message,
        args or ("job-a-worker-0",),
        None,
        extra=extra or None,
    )


def test_a_json_line_has_the_fields_of_where_it_was_logged() -> None:
    with log_fields(env="prod", service="operator"), log_fields(job="job-a"):
        record = _record()
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "created pod job-a-worker-0"
    assert (line["level"], line["logger"]) == ("INFO", "handlers.operator.reconcile.reconciler")
    assert (line["env"], line["service"], line["job"]) == ("prod", "operator", "job-a")
    assert "plan_id" not in line
    assert datetime.fromisoformat(line["timestamp"]).utcoffset() is not None


def test_extra_names_a_field_of_one_line_and_wins_over_the_context() -> None:
    with log_fields(env="prod", job="job-a"):
        record = _record(job="job-b", plan_id="p-1")
    assert line_fields(record) == {"env": "prod", "job": "job-b", "plan_id": "p-1"}


def test_fields_end_with_their_block_and_none_keeps_one() -> None:
    with log_fields(env="prod", service="brain"):
        with log_fields(service=None, job="j"):
            inner = _record()
        outer = _record()
    after = _record()
    assert line_fields(inner) == {"env": "prod", "service": "brain", "job": "j"}
    assert line_fields(outer) == {"env": "prod", "service": "brain"}
    assert line_fields(after) == {}


async def test_a_task_started_inside_keeps_the_fields() -> None:
    async def later() -> logging.LogRecord:
        await asyncio.sleep(0)
        return _record()

    with log_fields(env="prod", service="gateway"):
        task = asyncio.create_task(later())
    assert line_fields(await task) == {"env": "prod", "service": "gateway"}


def test_an_exception_is_one_field_of_the_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    assert "RuntimeError: boom" in json.loads(text)["exception"]


def test_a_text_line_shows_its_fields_before_the_message() -> None:
    with log_fields(env="prod", job="job-a"):
        record = _record()
    text = TextFormatter().format(record)
    assert text.endswith(
        " INFO handlers.operator.reconcile.reconciler [env=prod job=job-a]:"
        " created pod job-a-worker-0"
    )
    assert (
        TextFormatter()
        .format(_record())
        .endswith(" INFO handlers.operator.reconcile.reconciler: created pod job-a-worker-0")
    )


def test_short_commands_warn_services_inform_a_given_level_stays() -> None:
    logs.configure()
    assert logging.getLogger().level == logging.WARNING
    logs.for_service()
    assert logging.getLogger().level == logging.INFO
    assert logging.getLogger("faust").level == logging.WARNING  # a library's INFO stays out
    assert logging.getLogger("aiokafka").level == logging.CRITICAL
    logs.configure("error", "json")
    logs.for_service()
    assert logging.getLogger().level == logging.ERROR
    assert isinstance(logs._Setup.handler.formatter, JsonFormatter)  # type: ignore[union-attr]
    logs.configure(logs.LogLevel.DEBUG, LogFormat.TEXT)
    assert logging.getLogger("faust").level == logging.DEBUG  # DEBUG shows everything
    assert len([h for h in logging.getLogger().handlers if h is logs._Setup.handler]) == 1


def test_the_cli_takes_a_level_and_a_format_and_refuses_others_in_one_line() -> None:
    runner = CliRunner()
    app = cli  # (typer's runner builds the root from it)
    done = runner.invoke(app, ["--log-level", "debug", "--log-format", "JSON", "metrics", "list"])
    assert done.exit_code == 0, done.output
    assert logging.getLogger().level == logging.DEBUG
    assert isinstance(logs._Setup.handler.formatter, JsonFormatter)  # type: ignore[union-attr]
    bad = runner.invoke(app, ["metrics", "list"], env={logs.LEVEL_ENV: "loud"})
    assert bad.exit_code == 2 and "'loud' is not one of" in bad.output
    bad = runner.invoke(app, ["--log-format", "xml", "metrics", "list"])
    assert bad.exit_code == 2 and "'xml' is not one of" in bad.output
