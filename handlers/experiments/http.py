"""``/v1/experiments`` (admin token): what `dlrover-events experiment` does, for a notebook
or a pipeline.

- ``POST /v1/experiments``: an Experiment document as JSON; 201 with the experiment as
  submitted (published on ``<env>.experiments``), 400 when the body is not JSON, 422 with
  the ``field`` when it is not an experiment, 409 when the env has one of that name;
- ``GET /v1/experiments``: every experiment, with its trial count and best value;
- ``GET /v1/experiments/{name}``: one, with its trials, rungs and decisions;
- ``GET /v1/experiments/{name}/trials/{trial}/metrics``: a trial's reports by step;
- ``POST /v1/experiments/{name}/pause``, ``/activate``, ``/kill`` (an optional
  ``{"reason": ...}``): 202 once the ExperimentAction is published, 409 when the
  experiment has ended.

Reads are the experiments recorder's tables, so an experiment just created is listed once
the recorder has stored it (within a batch, well under a second). Every answer that is not
a 2xx is JSON with an ``error`` (and a ``field`` where one is wrong); nothing a client
sends reaches a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.errors import BusUnavailable, StoreUnavailable
from dlrover_events.experiments.document import (
    ExperimentInvalid,
    experiment_document,
    first_problem,
)
from dlrover_events.experiments.rows import FINAL
from dlrover_events.experiments.store import ExperimentNotFound, ExperimentStore
from schemas.experiments import (
    MAX_TRIAL_INDEX,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentDocument,
    ExperimentSubmitted,
)

#: An experiment is a few KiB; a body past this is refused before it is read whole.
MAX_BODY = 256 * 1024
PREFIX = "/v1/experiments"
STORE_KEY = web.AppKey("experiments", ExperimentStore)
TOKENS_KEY = web.AppKey("tokens", Tokens)
PRODUCER_KEY = web.AppKey("producer", Producer)
ENV_KEY = web.AppKey("env", str)


class Refused(Exception):
    """A request answered with ``status`` (a 4xx) and ``message``; ``field`` names what is
    wrong in the body (dotted, as the document spells it; "" for the body as a whole)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


@web.middleware
async def _admin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    verdict = await request.app[TOKENS_KEY].verify(
        request.headers.get("Authorization"), Scope.ADMIN
    )
    if verdict.status != 200:
        return _error(verdict.status, verdict.message)
    try:
        return await handler(request)
    except Refused as e:
        return _error(e.status, str(e), e.field)
    except ExperimentNotFound as e:
        return _error(404, f"no experiment named {e.name!r}")
    except (BusUnavailable, StoreUnavailable) as e:
        return _error(503, str(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(e.status, e.text or e.reason)


def parse_json(raw: bytes) -> Any:
    """A body as JSON, or a 400 saying why not."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise Refused(400, f"the body is not JSON: {e}") from None


def submitted_document(raw: bytes) -> ExperimentDocument:
    """The body of ``POST /v1/experiments`` as an experiment: a 400 when it is not JSON, a
    422 naming the field when it is not an experiment (pure: the property tests hold it
    to any input)."""
    data = parse_json(raw)
    try:
        return experiment_document(data)
    except ExperimentInvalid as e:
        raise Refused(422, str(e), e.field) from None


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    return await request.read()


async def _create(request: web.Request) -> web.StreamResponse:
    app = request.app
    document = submitted_document(await _body(request))
    name = document.metadata.name
    store = app[STORE_KEY]
    if await store.exists(name):
        status = await store.status(name)
        raise Refused(
            409, f"env {app[ENV_KEY]} already has an experiment named {name!r} ({status.value})"
        )
    event = ExperimentSubmitted(env=app[ENV_KEY], experiment=name, spec=document.spec, source="api")
    await app[PRODUCER_KEY].publish(event)
    return web.json_response(
        {
            "name": name,
            "env": event.env,
            "status": "submitted",
            "event_id": str(event.event_id),
            "spec": document.spec.model_dump(mode="json"),
        },
        status=201,
    )


async def _list(request: web.Request) -> web.StreamResponse:
    return web.json_response({"experiments": await request.app[STORE_KEY].experiments()})


async def _get(request: web.Request) -> web.StreamResponse:
    return web.json_response(await request.app[STORE_KEY].describe(request.match_info["name"]))


async def _metrics(request: web.Request) -> web.StreamResponse:
    name, trial = request.match_info["name"], request.match_info["trial"]
    if not trial.isdigit() or int(trial) > MAX_TRIAL_INDEX:
        raise Refused(400, f"trial {trial!r}: a trial's index, 0 to {MAX_TRIAL_INDEX}", "trial")
    rows = await request.app[STORE_KEY].trial_metrics(name, int(trial))
    return web.json_response({"experiment": name, "trial": int(trial), "metrics": rows})


async def _act(request: web.Request) -> web.StreamResponse:
    app = request.app
    name = request.match_info["name"]
    action = ExperimentActionKind(request.match_info["action"])
    raw = await _body(request)
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise Refused(422, 'the body is empty or {"reason": "..."}', "reason")
    status = await app[STORE_KEY].status(name)
    if status in FINAL:
        raise Refused(409, f"experiment {name} is {status.value}: nothing to {action.value}")
    try:
        event = ExperimentAction(
            env=app[ENV_KEY],
            experiment=name,
            action=action,
            reason=body.get("reason", ""),
            source="api",
        )
    except ValidationError as err:
        problem = first_problem(err, body)
        raise Refused(422, str(problem), problem.field) from None
    await app[PRODUCER_KEY].publish(event)
    return web.json_response(
        {"name": name, "action": action.value, "env": event.env, "event_id": str(event.event_id)},
        status=202,
    )


def experiments_app(
    store: ExperimentStore, tokens: Tokens, producer: Producer, env: str
) -> web.Application:
    """The experiments API of ``env``, to mount at `PREFIX` (``add_subapp``)."""
    app = web.Application(middlewares=[_admin_only], client_max_size=MAX_BODY)
    app[STORE_KEY] = store
    app[TOKENS_KEY] = tokens
    app[PRODUCER_KEY] = producer
    app[ENV_KEY] = env
    app.router.add_post("", _create)
    app.router.add_get("", _list)
    app.router.add_get("/{name}", _get)
    app.router.add_get("/{name}/trials/{trial}/metrics", _metrics)
    actions = "|".join(a.value for a in ExperimentActionKind)
    app.router.add_post(f"/{{name}}/{{action:{actions}}}", _act)
    return app


__all__ = ["MAX_BODY", "PREFIX", "Refused", "experiments_app", "parse_json", "submitted_document"]
