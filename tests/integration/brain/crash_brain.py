"""Run the brain, checkpoint once part-way, go on publishing plans, then stop and wait to
be killed with SIGKILL: the test gets a brain that died with plans published after its
last checkpoint and input it never read. Used by test_brain_crash.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from dlrover_events.settings import Settings
from streams.brain.runtime.app import Brain


class PausingBrain(Brain):
    def __init__(self, *args: Any, checkpoint_at: int, pause_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_at = checkpoint_at
        self.pause_at = pause_at
        self.checkpointed = False

    async def _handle(self, records: list[Any]) -> None:
        await super()._handle(records)
        done = self.processor.counters.processed
        if not self.checkpointed and done >= self.checkpoint_at:
            await self.checkpoint()
            self.checkpointed = True
            print(f"checkpointed at {done}", flush=True)
        if done >= self.pause_at:
            print(f"paused at {done}", flush=True)
            await asyncio.Event().wait()  # until SIGKILL


async def main(bootstrap: str, dsn: str, env: str, checkpoint_at: int, pause_at: int) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap, pg_dsn=dsn, session_timeout_ms=2000, heartbeat_interval_ms=300
    )
    brain = PausingBrain(
        settings,
        env,
        dsn,
        checkpoint_at=checkpoint_at,
        pause_at=pause_at,
        checkpoint_every_s=3600,  # only the one above: what follows it is lost in the crash
        batch_max=10,
    )
    await brain.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
