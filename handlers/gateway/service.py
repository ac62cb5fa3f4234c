"""The gateway as a service of `dlrover-events up` (entry point ``gateway``).

Listens where DLROVER_EVENTS_GATEWAY_HOST/PORT say (127.0.0.1:8470 by default); it is
ready once its index has caught up with the env's config feed. With
DLROVER_EVENTS_GATEWAY_CONFIGMAPS=true (and a kubeconfig or in-cluster credentials) it also
syncs the labelled ConfigMaps of DLROVER_EVENTS_GATEWAY_NAMESPACE into the env's documents.
"""

from __future__ import annotations

import logging

from dlrover_events.runtime.services import Service, ServiceContext
from handlers.gateway.runtime import GatewayServer, GatewaySettings

log = logging.getLogger(__name__)


async def run(ctx: ServiceContext, conf: GatewaySettings | None = None) -> None:
    """Serve until ``ctx.stop``; ``conf`` (the `gateway` command's flags) over the env's."""
    server = GatewayServer(
        ctx.settings,
        ctx.env,
        ctx.pg_dsn,
        conf or GatewaySettings(),
        registry=ctx.metrics,
        bus=ctx.bus,
    )
    async with server:
        await server.wait_ready()
        log.info("config gateway of env %s on %s", ctx.env, server.url)
        ctx.endpoints["config gateway"] = (
            f"{server.url}  (token: dlrover-events gateway-token create --env {ctx.env})"
        )
        ctx.ready.set()
        await ctx.stop.wait()


service = Service(
    name="gateway",
    description="config gateway: jobs fetch merged Include/Exclude/Configure documents (HTTP)",
    run=run,
)
