"""The platform over HTTP (admin token): what `dlrover-events job` does, for a notebook
or a CI pipeline: ``POST /v1/jobs`` (a TrainingJob as JSON), ``GET /v1/jobs``,
``GET /v1/jobs/{job}``, ``POST /v1/jobs/{job}/scale`` (``{"role", "replicas"}``: published
to the env's scale.plans, as the brain's plans are), ``POST /v1/jobs/{job}/suspend`` and
``/resume`` (plans too) and ``DELETE /v1/jobs/{job}``.

Served by the operator that owns the platform, on 127.0.0.1 unless configured; the
decisions are handlers.operator.doors.jobs', shared with the commands. Every answer that is not
a 2xx is JSON with a message; nothing a client sends reaches a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope, Tokens, job_scope
from handlers.operator.doors.actions import (
    JobNotFound,
    JobUnreadable,
    delete_job,
    job_of,
    resume_job,
    scale_job,
    suspend_job,
)
from handlers.operator.doors.jobs import (
    JobRequestError,
    ScaleForbidden,
    check_job_scale,
    scale_request,
    scale_request_by,
    submission,
    summary,
)
from handlers.operator.platform.api import Platform
from handlers.operator.platform.errors import Conflict, Invalid, ObjectNotFound, PlatformError

#: A job spec is a few KiB; a body past this is refused before it is read whole.
MAX_BODY = 256 * 1024
PLATFORM_KEY = web.AppKey("platform", Platform)
TOKENS_KEY = web.AppKey("tokens", Tokens)
PRODUCER_KEY = web.AppKey("producer", Producer)
ENV_KEY = web.AppKey("env", str)
#: (annotation, directory): where a platform that runs commands here runs a job's
WORKDIR_KEY = web.AppKey("workdir", tuple[str, str | None])

#: a platform's refusal -> the answer's status (any other failure of the platform: 502)
_REFUSALS: tuple[tuple[type[PlatformError], int], ...] = (
    (ObjectNotFound, 404),
    (Conflict, 409),
    (Invalid, 422),
)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


#: The route a job's own token may call too (its role that ``scales`` others).
_JOB_SCALE = "job-scale"


@web.middleware
async def _admin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An admin token on every call; a job's scale also takes that job's own token (the
    handler checks it: the job's uid is its scope)."""
    if request.match_info.route.name != _JOB_SCALE:
        verdict = await request.app[TOKENS_KEY].verify(
            request.headers.get("Authorization"), Scope.ADMIN
        )
        if verdict.status != 200:
            return _error(verdict.status, verdict.message)
    try:
        return await handler(request)
    except PlatformError as e:
        status = next((code for kind, code in _REFUSALS if isinstance(e, kind)), 502)
        return _error(status, str(e))


async def _json(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise _Bad(400, f"the body is not JSON: {e}") from None


class _Bad(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _guarded(handler: Handler) -> Handler:
    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except _Bad as e:
            return _error(e.status, str(e))
        except JobNotFound as e:
            return _error(404, str(e))
        except ScaleForbidden as e:
            return _error(403, str(e))
        except JobUnreadable as e:
            return _error(409, str(e))
        except JobRequestError as e:
            return _error(422, str(e))

    return run


async def _submit(request: web.Request) -> web.StreamResponse:
    annotation, workdir = request.app[WORKDIR_KEY]
    body = submission(await _json(request), workdir=workdir, annotation=annotation)
    got = await request.app[PLATFORM_KEY].submit_job(body)
    return web.json_response(summary(got), status=201)


async def _list(request: web.Request) -> web.StreamResponse:
    items, _ = await request.app[PLATFORM_KEY].list_jobs()
    return web.json_response({"jobs": [summary(j) for j in items]})


async def _get(request: web.Request) -> web.StreamResponse:
    platform = request.app[PLATFORM_KEY]
    job = await job_of(platform, request.match_info["job"])
    pods, _ = await platform.list_pods(job.name)
    nodes = [
        {"name": p.name, "phase": p.phase, "deleting": p.deleting}
        for p in sorted(pods, key=lambda p: p.name)
    ]
    return web.json_response({**summary(job), "spec": job.document.get("spec"), "nodes": nodes})


async def _scale(request: web.Request) -> web.StreamResponse:
    """A scale by an admin (source ``api``), or by the job itself with its own token: a
    role one of its roles ``scales``, within its bounds, the plan's source naming who asked
    (``job/<job>/<by>``, and the token) so the brain, the console and the audit see it."""
    app = request.app
    name = request.match_info["job"]
    authorization = request.headers.get("Authorization")
    verdict = await app[TOKENS_KEY].verify(authorization, Scope.ADMIN)
    if verdict.status == 403:  # a good token, not an admin's: the job's own?
        job = await job_of(app[PLATFORM_KEY], name)
        verdict = await app[TOKENS_KEY].verify(authorization, job_scope(job.uid))
    if verdict.status != 200:
        return _error(verdict.status, verdict.message)
    body = await _json(request)
    role, replicas = scale_request(body)
    source = "api"
    if not verdict.admin:
        check_job_scale(job, role, replicas)
        by = scale_request_by(body) or "pod"
        source = f"job/{name}/{by} (token {verdict.token_id})"
    plan = await scale_job(
        app[PLATFORM_KEY], app[PRODUCER_KEY], app[ENV_KEY], name, role, replicas, source=source
    )
    return web.json_response(
        {"plan_id": plan.plan_id, "env": plan.env, "source": plan.source}, status=202
    )


async def _suspend(request: web.Request) -> web.StreamResponse:
    app = request.app
    plan = await suspend_job(
        app[PLATFORM_KEY], app[PRODUCER_KEY], app[ENV_KEY], request.match_info["job"], source="api"
    )
    return web.json_response({"plan_id": plan.plan_id, "env": plan.env}, status=202)


async def _resume(request: web.Request) -> web.StreamResponse:
    app = request.app
    plan = await resume_job(
        app[PLATFORM_KEY], app[PRODUCER_KEY], app[ENV_KEY], request.match_info["job"], source="api"
    )
    return web.json_response({"plan_id": plan.plan_id, "env": plan.env}, status=202)


async def _delete(request: web.Request) -> web.StreamResponse:
    name = request.match_info["job"]
    await delete_job(request.app[PLATFORM_KEY], name)
    return web.json_response({"deleted": name})


def jobs_app(
    platform: Platform,
    tokens: Tokens,
    producer: Producer,
    env: str,
    workdir: tuple[str, str | None] = ("", None),
) -> web.Application:
    app = web.Application(middlewares=[_admin_only], client_max_size=MAX_BODY)
    app[PLATFORM_KEY] = platform
    app[TOKENS_KEY] = tokens
    app[PRODUCER_KEY] = producer
    app[ENV_KEY] = env
    app[WORKDIR_KEY] = workdir
    app.router.add_post("/v1/jobs", _guarded(_submit))
    app.router.add_get("/v1/jobs", _guarded(_list))
    app.router.add_get("/v1/jobs/{job}", _guarded(_get))
    app.router.add_post("/v1/jobs/{job}/scale", _guarded(_scale), name=_JOB_SCALE)
    app.router.add_post("/v1/jobs/{job}/suspend", _guarded(_suspend))
    app.router.add_post("/v1/jobs/{job}/resume", _guarded(_resume))
    app.router.add_delete("/v1/jobs/{job}", _guarded(_delete))
    return app


__all__ = ["MAX_BODY", "jobs_app"]
