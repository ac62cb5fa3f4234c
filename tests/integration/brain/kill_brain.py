"""A brain that kills itself with SIGKILL once its input offsets pass a point: a crash at
a point of the stream that the test chooses, wherever the courier and the checkpoint
are then. Used by test_brain_kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from dlrover_events.settings import Settings
from streams.brain.runtime.app import Brain


class DyingBrain(Brain):
    def __init__(self, *args: Any, die_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.die_at = die_at

    async def _handle(self, records: list[Any]) -> None:
        await super()._handle(records)
        if sum(self.processor.offsets.values()) >= self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)


async def main(bootstrap: str, dsn: str, env: str, die_at: int, batch_max: int = 7) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap, pg_dsn=dsn, session_timeout_ms=2000, heartbeat_interval_ms=300
    )
    brain = DyingBrain(
        settings, env, dsn, die_at=die_at, checkpoint_every_s=0.1, batch_max=batch_max
    )
    await brain.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    batch_max = int(sys.argv[5]) if len(sys.argv) > 5 else 7
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), batch_max))
