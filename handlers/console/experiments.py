"""The console's experiments: an env's experiments, and one experiment's page (its trials'
learning curves, the rungs, the best trial and its hyperparameters, what each trial was
told and why), read from the env's experiment tables through the queries every door
shares (dlrover_events.experiments.store: the recorder writes them); and pause, activate
and kill behind the env's admin token, each an ExperimentAction on the env's bus as
`experiment pause|activate|kill` and ``POST /v1/experiments/{name}/...`` publish it (the
searcher acts on it), refused once the experiment has ended.

Reading needs the env's read token (app.authenticate); an action checks the admin scope
again (actions.py), and whoami lists the actions for the page to show (``kind``
``experiment``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from dlrover_events.experiments.rows import FINAL
from dlrover_events.experiments.store import ExperimentNotFound, ExperimentStore
from handlers.console.actions import ACTOR, SOURCE, ActionError, body_of, need_admin
from schemas.experiments import ExperimentAction, ExperimentActionKind, ExperimentName

#: Trials whose curves one page shows: each is a query of its reports.
MAX_CURVES = 200
#: What a page asks of the store at once.
_CONCURRENT = 8
_NAME: TypeAdapter[str] = TypeAdapter(ExperimentName)


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    try:
        return _NAME.validate_python(name)
    except ValidationError:
        raise ActionError(
            400, "bad_name", f"{name!r} is not an experiment's name (a DNS label)"
        ) from None


async def _store(request: web.Request, env: str) -> ExperimentStore:
    return ExperimentStore(await request.app[ACTOR].views.pool(env))


async def experiment_list(request: web.Request) -> web.Response:
    env = request.match_info["env"]
    store = await _store(request, env)
    return web.json_response({"env": env, "experiments": await store.experiments()})


def curve(rows: list[dict[str, Any]], metric: str | None) -> list[list[float]]:
    """A trial's learning curve: [budget, value] of each validation report of the metric,
    in the order reported (by step)."""
    if metric is None:
        return []
    return [
        [r["budget"], r["metrics"][metric]]
        for r in rows
        if r["validation"] and metric in r["metrics"]
    ]


async def experiment_get(request: web.Request) -> web.Response:
    """The experiment as `experiment describe` has it, with each trial's curve."""
    env, name = request.match_info["env"], _name(request)
    store = await _store(request, env)
    try:
        described = await store.describe(name)
    except ExperimentNotFound as e:
        raise ActionError(404, "not_found", f"env {env}: {e}") from None
    trials = [t["trial"] for t in described["trials"]][:MAX_CURVES]
    gate = asyncio.Semaphore(_CONCURRENT)

    async def one(trial: int) -> list[list[float]]:
        async with gate:
            return curve(await store.trial_metrics(name, trial), described["metric"])

    curves = await asyncio.gather(*(one(t) for t in trials))
    described["curves"] = {str(t): c for t, c in zip(trials, curves, strict=True)}
    described["curves_of"] = len(trials)
    return web.json_response({"env": env, **described}, dumps=_dumps)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def experiment_action(request: web.Request) -> web.Response:
    """Pause, activate or kill: an ExperimentAction from the console, with the reason the
    page asked for; 409 once the experiment has ended (nothing would act on it)."""
    env, name = request.match_info["env"], _name(request)
    action = ExperimentActionKind(request.match_info["action"])
    await need_admin(request, env)
    body = await body_of(request)
    reason = body.get("reason", "") if isinstance(body, dict) else None
    if not isinstance(reason, str) or set(body) - {"reason"}:
        raise ActionError(400, "bad_body", 'the body is empty or {"reason": "why"}')
    store = await _store(request, env)
    try:
        status = await store.status(name)
    except ExperimentNotFound as e:
        raise ActionError(404, "not_found", f"env {env}: {e}") from None
    if status in FINAL:
        raise ActionError(
            409, "ended", f"experiment {name} is {status.value}: nothing to {action.value}"
        )
    try:
        event = ExperimentAction(
            env=env, source=SOURCE, experiment=name, action=action, reason=reason
        )
    except ValidationError as e:
        raise ActionError(400, "bad_body", f"reason: {e.errors()[0]['msg']}") from None
    await request.app[ACTOR].producer.publish(event)
    return web.json_response(
        {"experiment": name, "action": action.value, "env": env, "event_id": str(event.event_id)},
        status=202,
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/envs/{env}/experiments", experiment_list)
    app.router.add_get("/v1/envs/{env}/experiments/{name}", experiment_get)
    actions = "|".join(a.value for a in ExperimentActionKind)
    app.router.add_post(
        f"/v1/envs/{{env}}/experiments/{{name}}/{{action:{actions}}}", experiment_action
    )


__all__ = ["MAX_CURVES", "add_routes", "curve"]
