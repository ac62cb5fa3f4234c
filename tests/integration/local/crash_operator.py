"""The local operator, stopped dead at a named point of a named plan: it prints
``paused <plan> <step>`` and waits to be killed with SIGKILL, so a test kills it exactly
while it applies that plan (after the job's patch, or after its pods were made).

    python -m tests.integration.local.crash_operator ENV PLAN STEP
"""

from __future__ import annotations

import asyncio
import sys

from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import load_settings
from handlers.operator.local.runner import run
from schemas.plans import ScalePlan


async def main(env: str, plan_id: str, step: str) -> None:
    settings = load_settings()
    assert settings.pg_dsn is not None

    async def pause(name: str, plan: ScalePlan) -> None:
        if plan.plan_id == plan_id and name == step:
            print(f"paused {plan_id} {step}", flush=True)
            await asyncio.Event().wait()  # until SIGKILL

    ctx = ServiceContext(settings, env, settings.pg_dsn)
    await run(ctx, {"poll_s": 0.1, "api_port": 0}, on_step=pause)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
