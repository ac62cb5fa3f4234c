"""The console's model registry: an env's models, one model's versions and the lineage of
each (the checkpoint, its job, trial and experiment, the hyperparameters, the plans it
trained under), and a job's or an experiment's checkpoints, read from the env's tables
through the queries every door shares (dlrover_events.checkpoints.store). Reading needs
the env's read token (app.authenticate); the console registers nothing (`model
register` and ``POST /v1/models/{name}/versions`` do).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from dlrover_events.checkpoints.store import CheckpointStore, ModelNotFound
from handlers.console.actions import ACTOR, ActionError


async def _store(request: web.Request) -> CheckpointStore:
    return CheckpointStore(await request.app[ACTOR].views.pool(request.match_info["env"]))


def _json(body: Any) -> web.Response:
    return web.json_response(body, dumps=lambda v: orjson.dumps(v).decode())


async def model_list(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    return _json({"env": env, "models": await (await _store(request)).models()})


async def model_get(request: web.Request) -> web.Response:
    """The model, the version asked (the latest by default) with its lineage, and every
    version of the model."""
    env, name = request.match_info["env"], request.match_info["name"]
    raw = request.query.get("version")
    if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= 2**31 - 1):
        raise ActionError(400, "bad_version", f"version {raw!r}: a version's number, from 1")
    store = await _store(request)
    try:
        described = await store.describe(name, int(raw) if raw is not None else None)
        described["all_versions"] = await store.versions(name)
    except ModelNotFound as e:
        raise ActionError(404, "not_found", f"env {env}: {e}") from None
    return _json({"env": env, **described})


async def checkpoint_list(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    job, experiment = request.query.get("job"), request.query.get("experiment")
    if not job and not experiment:
        raise ActionError(400, "bad_query", "name a job (?job=) or an experiment (?experiment=)")
    rows = await (await _store(request)).checkpoints(
        job=job or None, experiment=experiment or None, include_deleted=True
    )
    return _json({"env": env, "checkpoints": rows})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/envs/{env}/models", model_list)
    app.router.add_get("/v1/envs/{env}/models/{name}", model_get)
    app.router.add_get("/v1/envs/{env}/checkpoints", checkpoint_list)


__all__ = ["add_routes"]
