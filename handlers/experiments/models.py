"""``/v1/checkpoints`` and ``/v1/models``: the env's checkpoint catalog and model registry
over HTTP, mounted beside ``/v1/experiments`` (what `checkpoint list` and `model ...` do,
for a notebook or a pipeline). Reads take the env's read token; registering a version
takes its admin token.

- ``GET /v1/checkpoints?job=J`` or ``?experiment=E`` (``&all=true``: deleted ones too):
  the checkpoints, newest first; ``GET /v1/checkpoints/{id}``: one;
- ``GET /v1/models``: every model; ``GET /v1/models/{name}``: the model and its latest
  version with its lineage (``?version=N``: that one); ``GET /v1/models/{name}/versions``;
- ``POST /v1/models/{name}/versions`` with ``{"checkpoint": ID}`` or
  ``{"best_of": EXPERIMENT}``, and optional ``notes``, ``labels`` (strings) and
  ``description``: 201 with the version and its lineage; 409 when the checkpoint is
  deleted or being deleted, 404 when it is unknown, 422 for a bad name or body.

Every answer that is not a 2xx is JSON with an ``error`` (and a ``field`` where one is
wrong).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from dlrover_events.checkpoints.store import (
    CheckpointGone,
    CheckpointNotFound,
    CheckpointStore,
    ModelNotFound,
    RegistrationRefused,
)
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.errors import StoreUnavailable
from handlers.experiments.http import Refused, parse_json

CHECKPOINTS_PREFIX = "/v1/checkpoints"
MODELS_PREFIX = "/v1/models"
#: A registration is a few lines of JSON.
MAX_BODY = 64 * 1024
STORE_KEY = web.AppKey("checkpoints", CheckpointStore)
TOKENS_KEY = web.AppKey("tokens", Tokens)
_BODY_KEYS = {"checkpoint", "best_of", "notes", "labels", "description"}


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


@web.middleware
async def _scoped(request: web.Request, handler: Handler) -> web.StreamResponse:
    needed = Scope.READ if request.method in ("GET", "HEAD") else Scope.ADMIN
    verdict = await request.app[TOKENS_KEY].verify(request.headers.get("Authorization"), needed)
    if verdict.status != 200:
        return _error(verdict.status, verdict.message)
    try:
        return await handler(request)
    except Refused as e:
        return _error(e.status, str(e), e.field)
    except (CheckpointNotFound, ModelNotFound) as e:
        return _error(404, str(e))
    except CheckpointGone as e:
        return _error(409, str(e))
    except RegistrationRefused as e:
        return _error(422, str(e))
    except StoreUnavailable as e:
        return _error(503, str(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(e.status, e.text or e.reason)


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise Refused(400, f"{name}: true or false", name)
    return value in ("true", "1")


async def _list_checkpoints(request: web.Request) -> web.StreamResponse:
    job, experiment = request.query.get("job"), request.query.get("experiment")
    if not job and not experiment:
        raise Refused(400, "name a job (?job=) or an experiment (?experiment=)", "job")
    rows = await request.app[STORE_KEY].checkpoints(
        job=job or None, experiment=experiment or None, include_deleted=_flag(request, "all")
    )
    return web.json_response({"checkpoints": rows})


async def _get_checkpoint(request: web.Request) -> web.StreamResponse:
    return web.json_response(await request.app[STORE_KEY].checkpoint(request.match_info["id"]))


async def _list_models(request: web.Request) -> web.StreamResponse:
    return web.json_response({"models": await request.app[STORE_KEY].models()})


async def _get_model(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("version")
    if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= 2**31 - 1):
        raise Refused(400, f"version {raw!r}: a version's number, from 1", "version")
    version = int(raw) if raw is not None else None
    return web.json_response(
        await request.app[STORE_KEY].describe(request.match_info["name"], version)
    )


async def _versions(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    return web.json_response(
        {"model": name, "versions": await request.app[STORE_KEY].versions(name)}
    )


def registration(body: Any) -> dict[str, Any]:
    """The body of a registration, checked (pure): one of ``checkpoint`` and ``best_of``,
    notes and description strings, labels a list of strings."""
    if not isinstance(body, dict):
        raise Refused(422, "the body is a JSON object", "")
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise Refused(422, f"unknown field {unknown[0]!r}", unknown[0])
    if ("checkpoint" in body) == ("best_of" in body):
        raise Refused(422, "give one of checkpoint (an id) and best_of (an experiment)", "")
    for key in ("checkpoint", "best_of", "notes", "description"):
        if key in body and not isinstance(body[key], str):
            raise Refused(422, f"{key}: a string", key)
    labels = body.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise Refused(422, "labels: a list of strings", "labels")
    return body


async def _register(request: web.Request) -> web.StreamResponse:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    body = registration(parse_json(await request.read()))
    store = request.app[STORE_KEY]
    checkpoint = body.get("checkpoint") or await store.best_of(body["best_of"])
    described = await store.register(
        request.match_info["name"],
        checkpoint,
        notes=body.get("notes", ""),
        labels=body.get("labels", []),
        description=body.get("description"),
        registered_by="api",
    )
    return web.json_response(described, status=201)


def _sub_app(store: CheckpointStore, tokens: Tokens) -> web.Application:
    app = web.Application(middlewares=[_scoped], client_max_size=MAX_BODY)
    app[STORE_KEY] = store
    app[TOKENS_KEY] = tokens
    return app


def checkpoints_app(store: CheckpointStore, tokens: Tokens) -> web.Application:
    """The catalog of the env, to mount at `CHECKPOINTS_PREFIX`."""
    app = _sub_app(store, tokens)
    app.router.add_get("", _list_checkpoints)
    app.router.add_get("/{id}", _get_checkpoint)
    return app


def models_app(store: CheckpointStore, tokens: Tokens) -> web.Application:
    """The model registry of the env, to mount at `MODELS_PREFIX`."""
    app = _sub_app(store, tokens)
    app.router.add_get("", _list_models)
    app.router.add_get("/{name}", _get_model)
    app.router.add_get("/{name}/versions", _versions)
    app.router.add_post("/{name}/versions", _register)
    return app


def mount(root: web.Application, store: CheckpointStore, tokens: Tokens) -> None:
    """Both, on the app that serves ``/v1/experiments``."""
    root.add_subapp(CHECKPOINTS_PREFIX, checkpoints_app(store, tokens))
    root.add_subapp(MODELS_PREFIX, models_app(store, tokens))


__all__ = [
    "CHECKPOINTS_PREFIX",
    "MODELS_PREFIX",
    "checkpoints_app",
    "models_app",
    "mount",
    "registration",
]
