"""The aiokafka log filter holds back the reporter thread's lines and no one else's."""

from __future__ import annotations

import logging
import threading

import pytest

from dlrover_events.sdk import quiet


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def in_thread(fn: object) -> int:
    idents: list[int] = []

    def run() -> None:
        idents.append(threading.get_ident())
        fn()  # type: ignore[operator]

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return idents[0]


def test_only_registered_threads_are_held_back_on_every_aiokafka_logger() -> None:
    import aiokafka.producer.sender  # noqa: F401 - its logger exists, as in the SDK

    log_filter = quiet.ThreadLogFilter()
    quiet.install(log_filter)
    handler = Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    registered = threading.Event()
    # an earlier test of the session may have run a command in-process, which quiets
    # aiokafka's logger (dlrover_events/cli/app.py): this test's loggers start plain
    kafka_loggers = [logging.getLogger(n) for n in ("aiokafka", "aiokafka.producer.sender")]
    saved = [(lg.disabled, lg.level, lg.propagate) for lg in kafka_loggers]
    for lg in kafka_loggers:
        lg.disabled, lg.propagate = False, True
        lg.setLevel(logging.NOTSET)
    try:
        module_logger = logging.getLogger("aiokafka.producer.sender")
        assert log_filter in module_logger.filters  # a record is checked where it is logged

        def reporter_thread() -> None:
            log_filter.register(threading.get_ident())
            registered.set()
            logging.getLogger("aiokafka").error("Unable connect to node")
            module_logger.warning("Got error produce response")
            logging.getLogger("someone.else").warning("the user's own line")

        reporter = in_thread(reporter_thread)
        # The application's own aiokafka, in its thread, keeps every line.
        logging.getLogger("aiokafka").error("the application's consumer")
        assert [r.getMessage() for r in handler.records] == [
            "the user's own line",
            "the application's consumer",
        ]
        assert log_filter.held(reporter) == 2
        assert log_filter.unregister(reporter) == 2
        assert log_filter.held(reporter) == 0
    finally:
        for lg, (disabled, level, propagate) in zip(kafka_loggers, saved, strict=True):
            lg.disabled, lg.propagate = disabled, propagate
            lg.setLevel(level)
        root.removeHandler(handler)
        root.setLevel(old_level)
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith("aiokafka"):
                logging.getLogger(name).removeFilter(log_filter)


def test_install_is_idempotent() -> None:
    log_filter = quiet.ThreadLogFilter()
    quiet.install(log_filter)
    quiet.install(log_filter)
    try:
        assert logging.getLogger("aiokafka").filters.count(log_filter) == 1
    finally:
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith("aiokafka"):
                logging.getLogger(name).removeFilter(log_filter)


def test_the_setting_is_quiet_by_default_and_a_bad_value_is_one_line() -> None:
    assert quiet.kafka_logs_quiet({}) is True
    assert quiet.kafka_logs_quiet({quiet.KAFKA_LOGS_ENV: "Show"}) is False
    with pytest.raises(ValueError, match="must be 'quiet' or 'show', got 'loud'"):
        quiet.kafka_logs_quiet({quiet.KAFKA_LOGS_ENV: "loud"})
