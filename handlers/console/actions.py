"""What an operator does from the console, behind the env's admin token: scale, suspend,
resume and delete a job, promote an env, revoke a token (and pause, activate or kill an
experiment: experiments.py). Each goes the way the CLI goes: a
job through handlers/operator/doors/actions.py (a scale, a suspend and a resume are each a
ScalePlan on the env's scale.plans, applied once by the env's operator and answered with a
ScaleResult, as `job scale|suspend|resume` and the jobs API do), an env through the
registry (`env promote`), a token through the env's tokens (`gateway-token revoke`).

The page shows a button for each action ``whoami`` lists for the caller, so a read-only
token sees none, and every route checks the token again (403 without the admin scope).
A job action is one row of JOB_ACTIONS.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope, Tokens, Verdict
from dlrover_events.errors import EnvError, UserError
from dlrover_events.settings import Settings
from handlers.console.envs import EnvViews, NoSuchEnv
from schemas.control import EnvMode

#: What a scale or promote body may be: a few fields.
MAX_BODY = 16 * 1024
SOURCE = "console"


@dataclass(frozen=True)
class PlatformOptions:
    """Where the real env's jobs are acted on (the console's settings)."""

    name: str = "local"
    kubeconfig: Path | None = None
    namespace: str | None = None


@dataclass(frozen=True)
class Actor:
    """What an action needs besides its request."""

    settings: Settings
    views: EnvViews
    producer: Producer
    platform: PlatformOptions


ACTOR: web.AppKey[Actor] = web.AppKey("actor", Actor)


class ActionError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@dataclass(frozen=True)
class JobAction:
    """One thing done to a job: its route (``/v1/envs/{env}/jobs/{job}`` + ``path``), the
    form the page shows for it, and what it does."""

    name: str
    method: str
    path: str
    label: str
    #: the page's form: name, type (text, number), default, min
    fields: tuple[dict[str, Any], ...]
    #: a question the page asks before (a delete)
    confirm: str
    run: Callable[[Actor, str, str, Any], Awaitable[dict[str, Any]]]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "method": self.method,
            "path": self.path,
            "label": self.label,
            "fields": list(self.fields),
            "confirm": self.confirm,
        }


# The operator's job actions are imported on use: a console that only watches never loads
# the platforms' modules.


async def _scale(actor: Actor, env: str, job: str, body: Any) -> dict[str, Any]:
    from handlers.operator.doors.actions import open_platform, scale_job
    from handlers.operator.doors.jobs import scale_request

    role, replicas = scale_request(body)
    p = actor.platform
    async with open_platform(
        actor.settings, env, p.name, kubeconfig=p.kubeconfig, namespace=p.namespace
    ) as platform:
        plan = await scale_job(platform, actor.producer, env, job, role, replicas, source=SOURCE)
    return {
        "plan_id": plan.plan_id,
        "env": plan.env,
        "job": job,
        "role": role,
        "replicas": replicas,
    }


async def _suspend(actor: Actor, env: str, job: str, body: Any) -> dict[str, Any]:
    from handlers.operator.doors.actions import open_platform, suspend_job

    p = actor.platform
    async with open_platform(
        actor.settings, env, p.name, kubeconfig=p.kubeconfig, namespace=p.namespace
    ) as platform:
        plan = await suspend_job(platform, actor.producer, env, job, source=SOURCE)
    return {"plan_id": plan.plan_id, "env": plan.env, "job": job}


async def _resume(actor: Actor, env: str, job: str, body: Any) -> dict[str, Any]:
    from handlers.operator.doors.actions import open_platform, resume_job

    p = actor.platform
    async with open_platform(
        actor.settings, env, p.name, kubeconfig=p.kubeconfig, namespace=p.namespace
    ) as platform:
        plan = await resume_job(platform, actor.producer, env, job, source=SOURCE)
    return {"plan_id": plan.plan_id, "env": plan.env, "job": job}


async def _delete(actor: Actor, env: str, job: str, body: Any) -> dict[str, Any]:
    from handlers.operator.doors.actions import delete_job, open_platform

    p = actor.platform
    async with open_platform(
        actor.settings, env, p.name, kubeconfig=p.kubeconfig, namespace=p.namespace
    ) as platform:
        await delete_job(platform, job)
    return {"deleted": job, "env": env}


JOB_ACTIONS: tuple[JobAction, ...] = (
    JobAction(
        name="scale",
        method="POST",
        path="/scale",
        label="Scale",
        fields=(
            {"name": "role", "type": "text", "default": "worker"},
            {"name": "replicas", "type": "number", "min": 1},
        ),
        confirm="",
        run=_scale,
    ),
    JobAction(
        name="suspend",
        method="POST",
        path="/suspend",
        label="Suspend",
        fields=(),
        confirm="Suspend job {job}? Its nodes stop after their checkpoint; a resume goes on.",
        run=_suspend,
    ),
    JobAction(
        name="resume",
        method="POST",
        path="/resume",
        label="Resume",
        fields=(),
        confirm="",
        run=_resume,
    ),
    JobAction(
        name="delete",
        method="DELETE",
        path="",
        label="Delete",
        fields=(),
        confirm="Delete job {job}? Its nodes are stopped.",
        run=_delete,
    ),
)


#: The actions on an experiment (handlers/console/experiments.py), as whoami lists them
#: for the page's buttons: an ExperimentAction each, in any env.
EXPERIMENT_ACTIONS: tuple[dict[str, str], ...] = (
    {
        "kind": "experiment",
        "name": "pause",
        "label": "Pause",
        "confirm": "Pause experiment {experiment}? Its running trials are suspended, "
        "their checkpoints kept.",
    },
    {"kind": "experiment", "name": "activate", "label": "Activate", "confirm": ""},
    {
        "kind": "experiment",
        "name": "kill",
        "label": "Kill",
        "confirm": "Kill experiment {experiment}? Every trial stops and its job is deleted.",
    },
)


async def body_of(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ActionError(413, "too_large", f"a request body is at most {MAX_BODY} bytes")
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise ActionError(413, "too_large", f"a request body is at most {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ActionError(400, "bad_body", f"the body is not JSON: {e}") from None


async def admin_verdict(request: web.Request, env: str) -> Verdict:
    tokens = await request.app[ACTOR].views.tokens(env)
    return await tokens.verify(request.headers.get("Authorization"), Scope.ADMIN)


async def need_admin(request: web.Request, env: str) -> None:
    verdict = await admin_verdict(request, env)
    if verdict.status != 200:
        code = "unauthorized" if verdict.status == 401 else "forbidden"
        raise ActionError(verdict.status, code, verdict.message)


async def _real(actor: Actor, env: str) -> None:
    record = await actor.views.record(env)
    if record.mode != EnvMode.REAL:
        raise ActionError(
            409,
            "virtual_env",
            f"env {env} is virtual: its jobs are simulated; jobs are acted on in the real env",
        )


def _job_route(action: JobAction) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        from handlers.operator.doors.actions import JobNotFound, JobUnreadable
        from handlers.operator.doors.jobs import JobRequestError

        env, job = request.match_info["env"], request.match_info["job"]
        actor = request.app[ACTOR]
        await need_admin(request, env)
        await _real(actor, env)
        body = await body_of(request)
        try:
            done = await action.run(actor, env, job, body)
        except JobNotFound as e:
            raise ActionError(404, "not_found", str(e)) from None
        except JobUnreadable as e:
            raise ActionError(409, "unreadable_job", str(e)) from None
        except JobRequestError as e:
            raise ActionError(422, "bad_request", str(e)) from None
        except UserError as e:
            raise ActionError(400, "bad_setting", str(e)) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ActionError(
                502,
                "platform_unavailable",
                f"cannot reach the {actor.platform.name} platform: {why}",
            ) from None
        # a plan published is accepted, not done: the operator's result says how it went
        return web.json_response(done, status=202 if "plan_id" in done else 200)

    return handle


async def promote(request: web.Request) -> web.StreamResponse:
    """``{"env": NAME, "reason": R}``: NAME becomes the real env. Only an admin of the env
    that is real now may hand its place over (an admin of a virtual env may not take it);
    with no real env, an admin of NAME."""
    actor = request.app[ACTOR]
    body = await body_of(request)
    target, reason = body.get("env") if isinstance(body, dict) else None, ""
    if isinstance(body, dict):
        reason = body.get("reason") or ""
    if not isinstance(target, str) or not isinstance(reason, str):
        raise ActionError(400, "bad_body", 'the body must be {"env": NAME, "reason": "why"}')
    await actor.views.record(target)
    real = next(
        (e.name for e in await actor.views.envs(fresh=True) if e.mode == EnvMode.REAL), None
    )
    await need_admin(request, real or target)
    try:
        new, old = await actor.views.registry.promote(target, reason=reason or "from the console")
    except EnvError as e:
        raise ActionError(409, "refused", str(e)) from None
    await actor.views.envs(fresh=True)
    return web.json_response({"real": new.name, "demoted": old.name if old else None})


async def revoke(request: web.Request) -> web.StreamResponse:
    env, token_id = request.match_info["env"], request.match_info["token_id"]
    await need_admin(request, env)
    tokens: Tokens = await request.app[ACTOR].views.tokens(env)
    if not await tokens.revoke(token_id):
        raise ActionError(404, "not_found", f"no active token {token_id!r} in env {env!r}")
    return web.json_response({"revoked": token_id, "env": env})


async def token_list(request: web.Request) -> web.StreamResponse:
    env = request.match_info["env"]
    await need_admin(request, env)
    tokens = await request.app[ACTOR].views.tokens(env)
    rows = [
        {
            "token_id": t.token_id,
            "name": t.name,
            "scopes": t.scopes,
            "created_at": t.created_at.isoformat(),
            "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
        }
        for t in await tokens.list()
    ]
    return web.json_response({"env": env, "tokens": rows})


async def allowed(request: web.Request, env: str, real: bool) -> list[dict[str, Any]]:
    """The actions the caller may take in ``env``, for the page to show (none to a
    read-only token)."""
    if (await admin_verdict(request, env)).status != 200:
        return []
    out: list[dict[str, Any]] = []
    if real:
        out += [{"kind": "job", **a.describe()} for a in JOB_ACTIONS]
        out.append({"kind": "env", "name": "promote", "label": "Promote"})
    out.append({"kind": "token", "name": "revoke", "label": "Revoke"})
    out += [dict(a) for a in EXPERIMENT_ACTIONS]  # any env: the bus carries them
    return out


@web.middleware
async def action_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ActionError as e:
        return error(e.status, e.code, e.message)
    except NoSuchEnv as e:
        return error(404, "no_such_env", str(e))


def add_routes(app: web.Application, actor: Actor) -> None:
    app[ACTOR] = actor
    for action in JOB_ACTIONS:
        app.router.add_route(
            action.method, "/v1/envs/{env}/jobs/{job}" + action.path, _job_route(action)
        )
    app.router.add_get("/v1/envs/{env}/tokens", token_list)
    app.router.add_post("/v1/envs/{env}/tokens/{token_id}/revoke", revoke)
    app.router.add_post("/v1/promote", promote)


__all__ = [
    "ACTOR",
    "EXPERIMENT_ACTIONS",
    "JOB_ACTIONS",
    "ActionError",
    "Actor",
    "JobAction",
    "PlatformOptions",
    "action_errors",
    "add_routes",
    "allowed",
    "body_of",
    "need_admin",
]
