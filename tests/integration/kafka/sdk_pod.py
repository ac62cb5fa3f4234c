"""A training process as a pod runs it: the SDK configured by DLROVER_EVENTS_* variables
only (bus address, security, identity). It trains for `argv[1]` steps, flushes, closes,
and prints its reporter's stats as one JSON line; the log (stderr) is the pod's log."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time

from dlrover_events.sdk import Reporter


def main(steps: int) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with Reporter.from_env(send_timeout_s=2.0, retry_backoff_max_s=0.5) as report:
        for _ in range(steps):
            time.sleep(0.005)  # the training step
            report.step(samples=8)
        report.flush(10.0)
    print(json.dumps(dataclasses.asdict(report.stats())))


if __name__ == "__main__":
    main(int(sys.argv[1]))
