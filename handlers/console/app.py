"""The console's HTTP face: the page, the live tail (server-sent events) and the jobs.

Every ``/v1`` route needs a bearer token of the env with the read scope, checked by the
gateway's ``Tokens``: one set of tokens for a job's config and an operator's console.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson
from aiohttp import web

from dlrover_events.bus.tail import Filter, Line, summary
from dlrover_events.bus.topics import ENV_TOPIC_NAMES
from dlrover_events.envs.tokens import Scope, Tokens
from handlers.console.hub import Hub, Subscription
from handlers.console.page import PAGE
from schemas.jobs import JobEvent

HUB: web.AppKey[Hub] = web.AppKey("hub", Hub)
TOKENS: web.AppKey[Tokens] = web.AppKey("tokens", Tokens)
ENV: web.AppKey[str] = web.AppKey("env", str)

#: A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_S = 15.0
MAX_BACKLOG = 500

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/v1/"):
        return await handler(request)
    try:
        verdict = await request.app[TOKENS].verify(request.headers.get("Authorization"), Scope.READ)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        return error(503, "unavailable", f"cannot check the token now: {err}")
    if verdict.status != 200:
        code = "unauthorized" if verdict.status == 401 else "forbidden"
        return error(verdict.status, code, verdict.message)
    return await handler(request)


async def page(request: web.Request) -> web.Response:
    env = request.app[ENV]
    options = "".join(f'<option value="{t}">{t}</option>' for t in ENV_TOPIC_NAMES)
    html = PAGE.replace("__ENV__", env).replace("__TOPICS__", options)
    return web.Response(text=html, content_type="text/html", charset="utf-8")


def line_json(line: Line) -> dict[str, Any]:
    e = line.event
    out: dict[str, Any] = {"topic": line.topic, "partition": line.partition, "offset": line.offset}
    if e is None:
        out["error"] = line.error
        return out
    out.update(
        type=e.type,
        job=e.job.uuid if isinstance(e, JobEvent) else e.key,
        at=e.occurred_at.isoformat(),
        summary=summary(e),
        event=e.model_dump(mode="json"),
    )
    return out


def sse(event: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def parse_feed(query: Any) -> tuple[frozenset[str], Filter, int]:
    topics = frozenset(query.getall("topic", [])) or frozenset(ENV_TOPIC_NAMES)
    unknown = sorted(topics - set(ENV_TOPIC_NAMES))
    if unknown:
        raise web.HTTPBadRequest(
            text=orjson.dumps(
                {
                    "error": {
                        "code": "bad_query",
                        "message": f"unknown topics {unknown}; env topics are "
                        f"{', '.join(ENV_TOPIC_NAMES)}",
                    }
                }
            ).decode(),
            content_type="application/json",
        )
    raw = query.get("backlog", "0")
    if not raw.isdigit() or int(raw) > MAX_BACKLOG:
        raise web.HTTPBadRequest(
            text=orjson.dumps(
                {"error": {"code": "bad_query", "message": f"backlog must be 0..{MAX_BACKLOG}"}}
            ).decode(),
            content_type="application/json",
        )
    where = Filter(job=query.get("job") or None, type_pattern=query.get("type") or None)
    return topics, where, int(raw)


async def events(request: web.Request) -> web.StreamResponse:
    """The live tail: ``ready`` once subscribed, then one ``line`` per matching message."""
    hub = request.app[HUB]
    topics, where, backlog = parse_feed(request.query)
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    sub = hub.subscribe(topics, where, backlog)
    try:
        await resp.write(sse("ready", {"env": request.app[ENV], "topics": sorted(topics)}))
        await _stream(resp, sub)
    except ConnectionResetError:
        pass  # the page went away
    finally:
        hub.unsubscribe(sub)
    return resp


async def _stream(resp: web.StreamResponse, sub: Subscription) -> None:
    told = 0
    while True:
        try:
            line = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
        except TimeoutError:
            await resp.write(b": keepalive\n\n")
            continue
        if line is None:
            return
        if sub.dropped != told:
            told = sub.dropped
            await resp.write(sse("dropped", {"dropped": told}))
        await resp.write(
            sse("line", line_json(line), f"{line.topic}:{line.partition}:{line.offset}")
        )


async def jobs(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    body = {
        "env": request.app[ENV],
        "caught_up": hub.ready.is_set(),
        "jobs": hub.board.snapshot(),
        "reports": list(hub.board.reports),
    }
    return web.json_response(body, dumps=lambda v: orjson.dumps(v).decode())


async def health(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    ready = hub.ready.is_set()
    return web.json_response(
        {"ready": ready, "subscribers": hub.subscribers}, status=200 if ready else 503
    )


def build_app(env: str, hub: Hub, tokens: Tokens) -> web.Application:
    app = web.Application(middlewares=[authenticate])
    app[ENV] = env
    app[HUB] = hub
    app[TOKENS] = tokens
    app.router.add_get("/", page)
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/jobs", jobs)
    return app


__all__ = ["build_app", "line_json", "parse_feed", "sse"]
