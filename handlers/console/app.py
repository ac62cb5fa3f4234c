"""The console's HTTP face: the page and its static files, and per env the live tail
(server-sent events), the jobs and one job's page, the dead letters, the config documents,
the A/B results and the experiments (handlers.console.experiments); the actions are
handlers.console.actions'.

Every ``/v1/envs/{env}`` route needs a bearer token of that env with the read scope,
checked by the env's ``Tokens`` (one set of tokens for a job's config and an operator's
console); ``/v1/envs`` takes a token of any env. Actions need the admin scope.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from dlrover_events.bus.tail import Filter, Line, summary
from dlrover_events.bus.topics import ENV_TOPIC_NAMES
from dlrover_events.envs.failover import last_switch, role, standby_name
from dlrover_events.envs.tokens import Scope, token_env
from handlers.console import ab, configs, experiments, models
from handlers.console.actions import Actor, action_errors, add_routes, allowed, error
from handlers.console.envs import EnvViews, NoSuchEnv, TooManyEnvs
from handlers.console.hub import Repeat, Subscription
from handlers.console.page import STATIC, index_html
from schemas.control import EnvMode
from schemas.jobs import JobEvent

VIEWS: web.AppKey[EnvViews] = web.AppKey("views", EnvViews)
AB_FOLDERS: web.AppKey[tuple[Path, ...]] = web.AppKey("ab_folders")

#: A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_S = 15.0
MAX_BACKLOG = 500
#: The page and its scripts come from this console only; nothing inline, nothing else.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda v: orjson.dumps(v).decode())


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/v1/") or request.path == "/v1/promote":
        return await handler(request)  # the page (no data, no secret); promote checks itself
    views = request.app[VIEWS]
    auth = request.headers.get("Authorization")
    env = request.match_info.get("env")
    if env is None:
        # the list of envs: any env's read token (its env is written in it)
        token = (auth or "").partition(" ")[2].strip()
        env = token_env(token) or views.home
    try:
        if env != views.home:
            try:
                await views.record(env)
            except NoSuchEnv:
                await views.forget(env)
                raise
        verdict = await (await views.tokens(env)).verify(auth, Scope.READ)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        return error(503, "unavailable", f"cannot check the token now: {err}")
    except TooManyEnvs as err:
        return error(503, "too_many_envs", str(err))
    if verdict.status != 200:
        code = "unauthorized" if verdict.status == 401 else "forbidden"
        return error(verdict.status, code, verdict.message)
    try:
        return await handler(request)
    except TooManyEnvs as err:
        return error(503, "too_many_envs", str(err))


async def page(request: web.Request) -> web.Response:
    return web.Response(
        text=index_html(request.app[VIEWS].home, ENV_TOPIC_NAMES),
        content_type="text/html",
        charset="utf-8",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


def line_json(line: Line) -> dict[str, Any]:
    e = line.event
    out: dict[str, Any] = {
        "id": f"{line.topic}:{line.partition}:{line.offset}",
        "topic": line.topic,
        "partition": line.partition,
        "offset": line.offset,
    }
    if e is None:
        out["error"] = line.error
        return out
    out.update(
        type=e.type,
        job=e.job.uuid if isinstance(e, JobEvent) else e.key,
        at=e.occurred_at.isoformat(),
        source=e.source,
        summary=summary(e),
        event=e.model_dump(mode="json"),
    )
    return out


def sse(event: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def _bad_query(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=orjson.dumps({"error": {"code": "bad_query", "message": message}}).decode(),
        content_type="application/json",
    )


def parse_feed(query: Any) -> tuple[frozenset[str], Filter, int]:
    topics = frozenset(query.getall("topic", [])) or frozenset(ENV_TOPIC_NAMES)
    unknown = sorted(topics - set(ENV_TOPIC_NAMES))
    if unknown:
        raise _bad_query(f"unknown topics {unknown}; env topics are {', '.join(ENV_TOPIC_NAMES)}")
    raw = query.get("backlog", "0")
    if not raw.isdigit() or int(raw) > MAX_BACKLOG:
        raise _bad_query(f"backlog must be 0..{MAX_BACKLOG}")
    where = Filter(job=query.get("job") or None, type_pattern=query.get("type") or None)
    return topics, where, int(raw)


async def events(request: web.Request) -> web.StreamResponse:
    """The live tail: ``ready`` once subscribed, then one ``line`` per matching message
    (and a ``repeat`` when an evaluator reports the same values again)."""
    env = request.match_info["env"]
    topics, where, backlog = parse_feed(request.query)
    hub = await request.app[VIEWS].hub(env)
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
        await resp.write(sse("ready", {"env": env, "topics": sorted(topics)}))
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
            item = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
        except TimeoutError:
            await resp.write(b": keepalive\n\n")
            continue
        if item is None:
            return
        if sub.dropped != told:
            told = sub.dropped
            await resp.write(sse("dropped", {"dropped": told}))
        if isinstance(item, Repeat):
            body = {"evaluator": item.evaluator, "repeats": item.repeats, "at": item.at}
            await resp.write(sse("repeat", body))
            continue
        line = line_json(item)
        await resp.write(sse("line", line, line["id"]))


async def envs(request: web.Request) -> web.Response:
    """The registry's envs, each with its role (real, the watchdog's standby, virtual), and
    the last switch of the real env with its reason."""
    views = request.app[VIEWS]
    listed = await views.envs(fresh=True)
    standby = standby_name()
    switch = last_switch(await views.registry.changes())
    return _json(
        {
            "home": views.home,
            "standby": standby,
            "last_switch": switch.as_json() if switch is not None else None,
            "envs": [
                {
                    "name": e.name,
                    "mode": e.mode.value,
                    "role": role(e.name, e.mode, standby).value,
                    "partitions": e.partitions,
                    "settings_version": e.settings_version,
                    "updated_at": e.updated_at.isoformat(),
                }
                for e in listed
            ],
        }
    )


async def whoami(request: web.Request) -> web.Response:
    """What the caller's token may do here: the page shows an action only if listed."""
    env = request.match_info["env"]
    views = request.app[VIEWS]
    record = await views.record(env)
    tokens = await views.tokens(env)
    verdict = await tokens.verify(request.headers.get("Authorization"), Scope.READ)
    real = record.mode == EnvMode.REAL
    actions = await allowed(request, env, real)
    return _json(
        {
            "env": env,
            "mode": record.mode.value,
            "token_id": verdict.token_id,
            "admin": bool(actions),
            "actions": actions,
        }
    )


async def jobs(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    hub = await request.app[VIEWS].hub(env)
    return _json(
        {
            "env": env,
            "caught_up": hub.ready.is_set(),
            "jobs": hub.board.snapshot(),
            "reports": hub.board.report_rows(),
            "letters_seen": hub.board.letters_seen,
        }
    )


async def job(request: web.Request) -> web.Response:
    env, key = request.match_info["env"], request.match_info["job"]
    hub = await request.app[VIEWS].hub(env)
    row = hub.board.job(key)
    if row is None:
        return error(
            404, "not_found", f"the console of env {env} knows no job {key!r} (or forgot it)"
        )
    return _json(row.detail())


async def dlq(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    board = (await request.app[VIEWS].hub(env)).board
    return _json({"env": env, "seen": board.letters_seen, "letters": list(reversed(board.letters))})


async def config_list(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    pool = await request.app[VIEWS].pool(env)
    return _json({"env": env, **await configs.list_documents(pool)})


async def config_get(request: web.Request) -> web.Response:
    env, name = request.match_info["env"], request.match_info["name"]
    doc = await configs.get_document(await request.app[VIEWS].pool(env), name)
    if doc is None:
        return error(404, "not_found", f"no config document {name!r} in env {env}")
    return _json({"env": env, "name": name, **doc})


async def ab_results(request: web.Request) -> web.Response:
    folders = request.app[AB_FOLDERS]
    found = await asyncio.to_thread(ab.ab_runs, folders)
    return _json({"env": request.match_info["env"], **found})


async def health(request: web.Request) -> web.Response:
    views = request.app[VIEWS]
    ready = views.home_hub().ready.is_set()
    return web.json_response(
        {"ready": ready, "subscribers": views.subscribers}, status=200 if ready else 503
    )


def build_app(views: EnvViews, actor: Actor, ab_folders: tuple[Path, ...] = ()) -> web.Application:
    app = web.Application(middlewares=[action_errors, authenticate])
    app[VIEWS] = views
    app[AB_FOLDERS] = ab_folders
    app.router.add_get("/", page)
    app.router.add_static("/static/", STATIC, append_version=False)
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/envs", envs)
    app.router.add_get("/v1/envs/{env}/whoami", whoami)
    app.router.add_get("/v1/envs/{env}/events", events)
    app.router.add_get("/v1/envs/{env}/jobs", jobs)
    app.router.add_get("/v1/envs/{env}/jobs/{job}", job)
    app.router.add_get("/v1/envs/{env}/dlq", dlq)
    app.router.add_get("/v1/envs/{env}/configs", config_list)
    app.router.add_get("/v1/envs/{env}/configs/{name}", config_get)
    app.router.add_get("/v1/envs/{env}/ab", ab_results)
    experiments.add_routes(app)
    models.add_routes(app)
    add_routes(app, actor)
    return app


__all__ = ["build_app", "line_json", "parse_feed", "sse"]
