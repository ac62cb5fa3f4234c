"""Commands: `gateway` (serve one env) and `gateway-token` (mint, list, revoke tokens).

They find Kafka and Postgres the way `up` does (settings, then the machine's Postgres), so
against a stack started by `dlrover-events up` they need no flags beyond the env.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from pathlib import Path

import typer

from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.envs.tokens import Scope, TokenInfo, Tokens
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import create_pool, env_schema
from handlers.gateway.runtime import GatewaySettings, prepare_env
from handlers.gateway.service import run


async def _dsn(settings: Settings) -> str:
    return (await resolve_postgres(settings)).dsn


def serve(
    env: str = typer.Option(
        None, "--env", "-e", parser=env_name, help="env to serve (default: settings)"
    ),
    host: str = typer.Option(
        None, "--host", help="listen address (default DLROVER_EVENTS_GATEWAY_HOST, 127.0.0.1)"
    ),
    port: int = typer.Option(
        None, "--port", "-p", min=0, max=65535, help="default DLROVER_EVENTS_GATEWAY_PORT, 8470"
    ),
    configmaps: bool = typer.Option(
        None,
        "--configmaps/--no-configmaps",
        help="sync labelled ConfigMaps (default: DLROVER_EVENTS_GATEWAY_CONFIGMAPS, off)",
    ),
    namespace: str = typer.Option(None, "--namespace", "-n", help="the ConfigMaps' namespace"),
    kubeconfig: Path = typer.Option(None, "--kubeconfig", help="cluster credentials"),
) -> None:
    """Serve the config gateway of one env until Ctrl-C."""
    settings = load_settings()
    options = {
        "host": host,
        "port": port,
        "configmaps": configmaps,
        "namespace": namespace,
        "kubeconfig": kubeconfig,
    }
    conf = GatewaySettings().model_copy(update={k: v for k, v in options.items() if v is not None})
    asyncio.run(_serve(settings, env or settings.default_env, conf))


async def _serve(settings: Settings, env: str, conf: GatewaySettings) -> None:
    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"gateway of env {env} on {ctx.endpoints['config gateway'].split()[0]} (OpenAPI "
            f"at /openapi.json; metrics at {ctx.endpoints['metrics']}, /healthz and /readyz "
            "beside them)"
        )

    # the fence refuses a missing env in one line
    await serve_alone(settings, env, "gateway", functools.partial(run, conf=conf), on_ready=say)


token_app = typer.Typer(
    help="Bearer tokens of an env's config gateway (stored hashed; shown once).",
    no_args_is_help=True,
)


async def _tokens(env: str) -> tuple[Tokens, str]:
    settings = load_settings()
    dsn = await _dsn(settings)
    await prepare_env(dsn, env)
    return Tokens(await create_pool(dsn, env_schema(env), max_size=1), env), dsn


@token_app.command("create")
def create_token(
    env: str = typer.Option(..., "--env", "-e", parser=env_name, help="the env the token is for"),
    scope: list[Scope] = typer.Option(
        [Scope.READ], "--scope", help="read (jobs) or admin (documents; includes read); repeatable"
    ),
    name: str = typer.Option("", "--name", help="who or what it is for"),
) -> None:
    """Mint a token and print it (only its SHA-256 is stored: keep it now)."""

    async def run() -> str:
        tokens, _ = await _tokens(env)
        try:
            token_id, token = await tokens.mint(name or f"{'+'.join(scope)} token", scope)
        finally:
            await tokens.pool.close()
        typer.echo(f"token {token_id} for env {env} ({', '.join(scope)}):", err=True)
        return token

    typer.echo(asyncio.run(run()))


@token_app.command("list")
def list_tokens(
    env: str = typer.Option(..., "--env", "-e", parser=env_name),
    as_json: bool = json_option("a JSON list of the tokens (never the tokens themselves)"),
) -> None:
    """Tokens of an env (ids, names, scopes; never the tokens)."""

    async def run() -> list[TokenInfo]:
        tokens, _ = await _tokens(env)
        try:
            return await tokens.list()
        finally:
            await tokens.pool.close()

    found = asyncio.run(run())
    if as_json:
        print_json([dataclasses.asdict(t) for t in found])
        return
    for t in found:
        state = "revoked" if t.revoked_at else "active"
        typer.echo(f"{t.token_id}  {state:8} {','.join(t.scopes):12} {t.name}")


@token_app.command("revoke")
def revoke_token(
    token_id: str = typer.Argument(..., help="the id `list` shows"),
    env: str = typer.Option(..., "--env", "-e", parser=env_name),
) -> None:
    """Revoke a token; gateways stop accepting it within their cache time (5 s)."""

    async def run() -> bool:
        tokens, _ = await _tokens(env)
        try:
            return await tokens.revoke(token_id)
        finally:
            await tokens.pool.close()

    if not asyncio.run(run()):
        raise UserError(f"no active token {token_id!r} in env {env!r}")
    typer.echo(f"revoked {token_id}")
