"""Which env a command means: the one named (which must exist), else the real one.

Commands that read an env's tables (`checkpoint`, `model`) take ``--env`` and default
to the env the registry says is real now, as `experiment` and `job` do.
"""

from __future__ import annotations

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings


async def chosen_env(settings: Settings, dsn: str, env: str | None) -> str:
    """The env named (which must exist), else the one the registry says is real now."""
    registry = EnvRegistry(settings, dsn)
    if env is not None:
        if await registry.get(env) is None:
            raise UserError(f"no env named {env!r} (see `dlrover-events env list`)")
        return env
    real = await registry.real()
    if real is None:
        raise UserError("no env is real; name one with --env")
    return real.name


__all__ = ["chosen_env"]
