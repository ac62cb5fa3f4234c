"""The HTTP layer: thin aiohttp handlers over GatewayState (reads) and ConfigStore (admin).

Every user mistake is a 4xx with a JSON body that says what to fix; a 5xx means a bug or
an unavailable dependency (503), never bad input. Reads are answered from memory only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError

from dlrover_events.config.matching import MAX_KEY, Job, make_job, problems
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.errors import BusUnavailable, StoreUnavailable
from dlrover_events.lifecycle import Stopping
from dlrover_events.runtime.metrics import GatewayMetrics
from handlers.gateway.http_rules import (
    INT32,
    Refused,
    body_problem,
    check_name,
    parse_body,
    parse_if_match,
)
from handlers.gateway.openapi import (
    MAX_ETAGS,
    MAX_OPTIMIZE_BODY,
    MAX_OPTIMIZE_TIMEOUT_S,
    MAX_VALUE,
    MAX_WAIT_S,
    OPTIMIZE_TIMEOUT_S,
    openapi_document,
)
from handlers.gateway.plan_state import Busy, PlanBook
from handlers.gateway.plans import MAX_JOB, OptimizeBody, has_nul
from handlers.gateway.state import GatewayState
from handlers.gateway.store import ConfigStore, StoreError
from schemas.bounds import MAX_CONFIG_DOCUMENT_BYTES
from schemas.config import ConfigDocument
from schemas.envelope import Event
from schemas.plans import OptimizeRequest

log = logging.getLogger(__name__)

API = "/v1"
MAX_ATTRS = 64
#: The whole query line and each header may be this long (aiohttp's default is 8 KiB).
MAX_LINE = 64 * 1024
#: Query parameters of /v1/config that are not job attributes.
RESERVED = frozenset({"wait"})
#: RFC 3339 date-time, what the OpenAPI document's `format: date-time` promises; pydantic
#: alone would also take "0" (a Unix time) and so accept what the document forbids.
_DATE_TIME = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)

#: Publishes an event and returns once the broker has it.
Publish = Callable[[Event], Awaitable[None]]


#: Defaults of the gateway's bounds on slow and waiting clients (GatewaySettings).
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
MAX_CONFIG_WAITERS = 10_000


@dataclass(frozen=True)
class Limits:
    """Bounds on what clients may hold: without them 300 clients sending their headers
    slowly held 1,334 file descriptors for 40 s, and long-polls had no ceiling."""

    #: a connection must deliver a request's headers within this long of opening, or
    #: of its previous answer (aiohttp's keep-alive timer, which also runs on a
    #: connection that has not sent a whole request yet)
    header_timeout_s: float = HEADER_TIMEOUT_S
    #: a body must arrive whole within this long of its headers: 408 past it
    body_timeout_s: float = BODY_TIMEOUT_S
    #: /v1/config long-polls waiting at once: 503 past it
    config_waiters: int = MAX_CONFIG_WAITERS


@dataclass
class Gateway:
    """What the handlers need; built and started by ``runtime``."""

    env: str
    state: GatewayState
    store: ConfigStore
    tokens: Tokens
    registry: CollectorRegistry
    plans: PlanBook
    publish: Publish
    limits: Limits = dataclasses.field(default_factory=Limits)
    #: set while the bus answers (`up` clears it while the broker is away): not ready then
    bus: asyncio.Event | None = None
    #: /v1/config long-polls waiting now
    config_waiting: int = 0


GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)

#: Scope each route needs; routes not listed (and unknown paths) need ``read``.
OPEN_ROUTES = frozenset({"/healthz", "/readyz"})
ADMIN_PREFIX = f"{API}/documents"
HISTORY_PREFIX = f"{API}/history"


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, details: Any = None, **headers: str
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> web.Response:
    body: dict[str, Any] = {"status": status, "code": code, "message": message}
    if details is not None:
        body["details"] = details
    return web.Response(
        status=status,
        body=orjson.dumps({"error": body}),
        content_type="application/json",
        headers=headers,
    )


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(obj),
        content_type="application/json",
        headers=headers,
    )


def gateway_metrics(registry: CollectorRegistry, gateway: Gateway) -> GatewayMetrics:
    state, plans = gateway.state, gateway.plans
    return GatewayMetrics(
        registry,
        gateway.env,
        documents=lambda: len(state.index),
        ready=lambda: 1 if state.ready.is_set() else 0,
        changes_applied=lambda: state.applied,
        plan_jobs=lambda: len(plans),
        plan_waiters=lambda: plans.waiting,
        plans_ready=lambda: 1 if plans.ready.is_set() else 0,
        plan_jobs_evicted=lambda: plans.evicted,
    )


METRICS: web.AppKey[GatewayMetrics] = web.AppKey("metrics", GatewayMetrics)


def _route_name(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource
    return resource.canonical if resource is not None else "unmatched"


def _needed_scope(route: str, path: str) -> Scope | None:
    """By route; an open path keeps needing nothing for a method it does not have, so
    the answer there is 405 with Allow, as for anyone, not 401."""
    if route in OPEN_ROUTES or path in OPEN_ROUTES:
        return None
    if route.startswith((ADMIN_PREFIX, HISTORY_PREFIX)):
        return Scope.ADMIN
    return Scope.READ


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Auth, errors as JSON, metrics: the only cross-cutting code, in one place."""
    started = time.perf_counter()
    route = _route_name(request)
    try:
        needed = _needed_scope(route, request.path)
        if needed is not None:
            gw = request.app[GATEWAY]
            verdict = await gw.tokens.verify(request.headers.get("Authorization"), needed)
            if verdict.status == 401:
                raise ApiError(
                    401,
                    "unauthorized",
                    verdict.message,
                    **{"WWW-Authenticate": 'Bearer realm="dlrover-events"'},
                )
            if verdict.status != 200:
                raise ApiError(verdict.status, "forbidden", verdict.message)
        response = await handler(request)
    except ApiError as err:
        response = error_response(err.status, err.code, err.message, err.details, err.headers)
    except Refused as err:
        response = error_response(err.status, err.code, err.message)
    except StoreError as err:
        response = error_response(err.status, err.code, err.message, err.details or None)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        response = error_response(
            err.status,
            err.reason.lower().replace(" ", "_"),
            _http_message(err),
            headers={k: v for k, v in err.headers.items() if k.lower() == "allow"},
        )
    except StoreUnavailable as err:
        response = error_response(503, "store_unavailable", str(err))
    except (BusUnavailable, KafkaError) as err:
        log.warning("bus unavailable on %s %s: %s", request.method, request.path, err)
        response = error_response(503, "bus_unavailable", f"the bus is unavailable: {err}")
    except (OSError, ConnectionError) as err:
        log.warning("dependency unavailable on %s %s: %s", request.method, request.path, err)
        response = error_response(503, "unavailable", f"a dependency is unavailable: {err}")
    except Exception:
        log.exception("bug on %s %s", request.method, request.path)
        response = error_response(500, "internal", "internal error; see the gateway's log")
    if response.status == 408:
        response.force_close()  # the rest of a body that came too slowly is not awaited
    request.app[METRICS].answered(
        route, request.method, response.status, time.perf_counter() - started
    )
    return response


def _http_message(err: web.HTTPException) -> str:
    if err.status == 404:
        return "no such route; see /openapi.json"
    if err.status == 405:
        return f"method not allowed here; allowed: {err.headers.get('Allow', '')}"
    if err.status == 413:
        return f"request body too large: at most {MAX_CONFIG_DOCUMENT_BYTES} bytes"
    return err.reason


# --- reads -------------------------------------------------------------------------------


def parse_job(query: Any) -> tuple[Job, float]:
    """Job attributes and the long-poll wait from the query string, or a 400."""
    attrs: dict[str, list[str]] = {}
    wait = 0.0
    if len(query) > MAX_ATTRS:
        raise ApiError(400, "bad_query", f"at most {MAX_ATTRS} query parameters")
    for key, value in query.items():
        k = key.strip().casefold()
        if k in RESERVED:
            wait = _parse_wait(value)
            continue
        if not k or len(k) > MAX_KEY:
            raise ApiError(
                400, "bad_query", f"attribute names must be 1 to {MAX_KEY} characters: {key!r}"
            )
        if len(value) > MAX_VALUE:
            raise ApiError(
                400, "bad_query", f"value of {key!r} is longer than {MAX_VALUE} characters"
            )
        attrs.setdefault(k, []).append(value)
    return make_job(attrs), wait


def _parse_wait(value: str) -> float:
    try:
        wait = float(value)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_S:
        raise ApiError(
            400, "bad_query", f"wait must be a number of seconds from 0 to {MAX_WAIT_S:g}"
        )
    return wait


def _etags(header: str | None) -> frozenset[str]:
    if not header:
        return frozenset()
    out = set()
    for part in header.split(","):
        tag = part.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag:
            out.add(tag)
    return frozenset(out)


async def get_config(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    job, wait = parse_job(request.query)
    if not gw.state.ready.is_set():
        raise ApiError(503, "not_ready", "the gateway is still reading the config feed")
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and len(if_none_match) > MAX_ETAGS:
        raise ApiError(400, "bad_header", f"If-None-Match is longer than {MAX_ETAGS} characters")
    seen = _etags(if_none_match)
    answer = gw.state.answer(job)
    if wait > 0 and answer.etag in seen:
        if gw.config_waiting >= gw.limits.config_waiters:
            raise ApiError(
                503,
                "too_many_waiters",
                f"{gw.config_waiting} long-polls are waiting already, the most this gateway"
                f" holds ({gw.limits.config_waiters}, DLROVER_EVENTS_GATEWAY_CONFIG_WAITERS);"
                " retry without wait, or later",
                **{"Retry-After": "1"},
            )
        metrics = request.app[METRICS]
        metrics.long_polls.inc()
        gw.config_waiting += 1
        try:
            answer = await gw.state.wait_for_change(job, seen, wait)
        finally:
            gw.config_waiting -= 1
            metrics.long_polls.dec()
    headers = {"ETag": answer.etag, "Cache-Control": "no-cache"}
    if answer.etag in seen or "*" in seen:
        return web.Response(status=304, headers=headers)
    return web.Response(body=answer.body, content_type="application/json", headers=headers)


async def healthz(request: web.Request) -> web.StreamResponse:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Ready once the config feed and the job and plan topics were read to their end."""
    gw = request.app[GATEWAY]
    bus = gw.bus is None or gw.bus.is_set()
    ready = gw.state.ready.is_set() and gw.plans.ready.is_set() and bus
    body = {"ready": ready, "bus": bus, "documents": len(gw.state.index), "jobs": len(gw.plans)}
    return json_response(body, 200 if ready else 503)


async def metrics_route(request: web.Request) -> web.StreamResponse:
    body = generate_latest(request.app[GATEWAY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.StreamResponse:
    return json_response(openapi_document())


# --- admin -------------------------------------------------------------------------------


def _doc_json(doc: ConfigDocument) -> dict[str, Any]:
    return doc.model_dump(mode="json", by_alias=True)


def _doc_response(doc: ConfigDocument, status: int = 200) -> web.Response:
    headers = {"ETag": f'"{doc.version}"', "Location": f"{ADMIN_PREFIX}/{doc.name}"}
    return json_response(_doc_json(doc), status, headers)


async def _read(request: web.Request) -> bytes:
    """The body, within the body timeout: a client that trickles it gets a 408."""
    limit = request.app[GATEWAY].limits.body_timeout_s
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the body did not arrive within {limit:g} s of the headers"
            " (DLROVER_EVENTS_GATEWAY_BODY_TIMEOUT_S)",
        ) from None


async def _body(request: web.Request) -> dict[str, Any]:
    obj = parse_body(await _read(request))
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_document", "the body must be a JSON object (a document)")
    problem = body_problem(obj)
    if problem is not None:
        raise ApiError(422, "invalid_document", f"the document {problem}")
    return obj


def _validate(obj: dict[str, Any]) -> ConfigDocument:
    """Strict, from JSON: ``"3"`` is not a priority, as the OpenAPI schema says."""
    for field in ("version", "priority"):  # 3.0 is an integer in JSON Schema, and so here
        value = obj.get(field)
        if isinstance(value, float) and value.is_integer() and abs(value) <= INT32:
            obj[field] = int(value)
    stamp = obj.get("updated_at")
    if isinstance(stamp, str) and not _DATE_TIME.match(stamp):
        raise ApiError(
            422,
            "invalid_document",
            "updated_at must be an RFC 3339 date-time (it is the server's anyway: leave it out)",
            [{"loc": ["updated_at"], "message": "not an RFC 3339 date-time"}],
        )
    try:
        doc = ConfigDocument.model_validate_json(orjson.dumps(obj), strict=True)
    except ValidationError as err:
        details = [
            {"loc": [str(p) for p in e["loc"]], "message": e["msg"]}
            for e in err.errors(include_url=False)
        ]
        raise ApiError(422, "invalid_document", "the document does not validate", details) from None
    found = problems(doc)
    if not -INT32 <= doc.priority <= INT32 or doc.version > INT32:
        found.append(f"priority and version must be within ±{INT32}")
    if found:
        raise ApiError(422, "invalid_document", "; ".join(found), found)
    size = len(orjson.dumps(_doc_json(doc)))
    if size > MAX_CONFIG_DOCUMENT_BYTES:
        raise ApiError(
            413,
            "request_entity_too_large",
            f"the document is {size} bytes as JSON, more than a document's"
            f" {MAX_CONFIG_DOCUMENT_BYTES}",
        )
    return doc


def _expected_version(request: web.Request) -> int:
    """The version being changed, from If-Match (the HTTP way to say "only if still")."""
    if_match = request.headers.get("If-Match")
    if if_match is None:
        raise ApiError(
            428,
            "version_required",
            'say which version you are changing: If-Match: "<version>" '
            "(the version field of the document you read)",
        )
    return parse_if_match(if_match)


async def list_documents(request: web.Request) -> web.StreamResponse:
    docs = await request.app[GATEWAY].store.documents()
    return json_response({"documents": [_doc_json(d) for d in docs]})


async def create_document(request: web.Request) -> web.StreamResponse:
    doc = _validate(await _body(request))  # version and updated_at: the server's
    stored = await request.app[GATEWAY].store.create(doc)
    return _doc_response(stored, 201)


async def get_document(request: web.Request) -> web.StreamResponse:
    name = check_name(request.match_info["name"])
    doc = await request.app[GATEWAY].store.get(name)
    if doc is None:
        raise ApiError(404, "not_found", f"no document named {name!r}")
    return _doc_response(doc)


async def update_document(request: web.Request) -> web.StreamResponse:
    name = check_name(request.match_info["name"])
    body = await _body(request)
    expected = _expected_version(request)
    if body.setdefault("name", name) != name:
        raise ApiError(
            400, "name_mismatch", f"the body names {body['name']!r} but the URL names {name!r}"
        )
    doc = _validate(body)
    stored = await request.app[GATEWAY].store.update(doc, expected)
    return _doc_response(stored)


async def delete_document(request: web.Request) -> web.StreamResponse:
    name = check_name(request.match_info["name"])
    expected = _expected_version(request)
    version = await request.app[GATEWAY].store.delete(name, expected)
    return json_response({"name": name, "version": version, "deleted": True})


async def document_history(request: web.Request) -> web.StreamResponse:
    name = check_name(request.match_info["name"])
    entries = await request.app[GATEWAY].store.history(name)
    if not entries:
        raise ApiError(404, "not_found", f"no document named {name!r} was ever stored")
    return json_response(
        {
            "name": name,
            "history": [
                {
                    "version": e.version,
                    "op": e.op,
                    "document": _doc_json(e.document) if e.document is not None else None,
                    "changed_at": e.changed_at.isoformat(),
                }
                for e in entries
            ],
        }
    )


# --- jobs' plans --------------------------------------------------------------------------


def _job(request: web.Request) -> str:
    job = request.match_info["job"]
    if len(job) > MAX_JOB:
        raise ApiError(400, "bad_job", f"a job uuid is at most {MAX_JOB} characters")
    return job


def _only(query: Any, allowed: frozenset[str]) -> dict[str, str]:
    """The query's parameters, each at most once; an unknown one is a typo worth a 400
    (a misspelt ``wait`` would otherwise silently not wait)."""
    out: dict[str, str] = {}
    for key, value in query.items():
        if key not in allowed:
            names = ", ".join(sorted(allowed))
            raise ApiError(400, "bad_query", f"unknown query parameter {key!r}; known: {names}")
        if key in out:
            raise ApiError(400, "bad_query", f"{key!r} is given more than once")
        out[key] = value
    return out


def _plans_ready(gw: Gateway) -> PlanBook:
    if not gw.plans.ready.is_set():
        raise ApiError(503, "not_ready", "the gateway is still reading the job and plan topics")
    return gw.plans


def _unknown_job(gw: Gateway, job: str) -> ApiError:
    return ApiError(
        404,
        "unknown_job",
        f"no job {job[:MAX_JOB]!r} is known to env {gw.env!r}: a job is known once its"
        " job.submitted, or a plan for it, is on the env's topics",
    )


async def get_plan(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    job = _job(request)
    query = _only(request.query, frozenset({"wait"}))
    wait = _parse_wait(query["wait"]) if "wait" in query else 0.0
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and len(if_none_match) > MAX_ETAGS:
        raise ApiError(400, "bad_header", f"If-None-Match is longer than {MAX_ETAGS} characters")
    plans = _plans_ready(gw)
    seen = _etags(if_none_match)
    answer = plans.answer(job)
    if answer is not None and wait > 0 and answer.etag in seen:
        try:
            with plans.admit():
                answer = await plans.wait_for_change(job, seen, wait)
        except Busy as err:
            message = f"{err}; retry without wait, or later"
            raise ApiError(503, "too_many_waiters", message) from None
    if answer is None:
        raise _unknown_job(gw, job)
    headers = {"ETag": answer.etag, "Cache-Control": "no-cache"}
    if answer.etag in seen or "*" in seen:
        return web.Response(status=304, headers=headers)
    return web.Response(body=answer.body, content_type="application/json", headers=headers)


def _parse_timeout(query: dict[str, str]) -> float:
    raw = query.get("timeout")
    if raw is None:
        return OPTIMIZE_TIMEOUT_S
    try:
        timeout = float(raw)
    except ValueError:
        timeout = math.nan
    if not 0 < timeout <= MAX_OPTIMIZE_TIMEOUT_S:
        raise ApiError(
            400,
            "bad_query",
            f"timeout must be a number of seconds above 0, at most {MAX_OPTIMIZE_TIMEOUT_S:g}",
        )
    return timeout


async def _optimize_body(request: web.Request) -> OptimizeBody:
    raw = await _read(request)
    if len(raw) > MAX_OPTIMIZE_BODY:
        raise ApiError(413, "request_entity_too_large", f"the body is over {MAX_OPTIMIZE_BODY} B")
    obj = parse_body(raw)
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_request", 'the body must be a JSON object: {"stage": ...}')
    problem = body_problem(obj)
    if problem is not None:
        raise ApiError(422, "invalid_request", f"the request {problem}")
    if has_nul(obj):
        raise ApiError(422, "invalid_request", "the body holds a NUL character (\\u0000)")
    try:
        return OptimizeBody.model_validate(obj, strict=True)
    except ValidationError as err:
        details = [
            {"loc": [str(p) for p in e["loc"]], "message": e["msg"]}
            for e in err.errors(include_url=False)
        ]
        raise ApiError(422, "invalid_request", "the request does not validate", details) from None


async def optimize(request: web.Request) -> web.StreamResponse:
    """Publish an OptimizeRequest for the job and answer with the OptimizePlan the brain
    makes of it (its ``caused_by`` is the request's event id), or 504 after ``timeout``."""
    gw = request.app[GATEWAY]
    job = _job(request)
    timeout = _parse_timeout(_only(request.query, frozenset({"timeout"})))
    body = await _optimize_body(request)
    plans = _plans_ready(gw)
    view = plans.view(job)
    if view is None:
        raise _unknown_job(gw, job)
    if view.finished:
        raise ApiError(409, "job_finished", f"job {job!r} has finished; the brain plans no more")
    try:
        event = OptimizeRequest(
            env=gw.env,
            job=view.job,
            source="gateway",
            stage=body.stage,
            optimizer=body.optimizer,
            config=body.config,
        )
    except ValidationError as err:
        raise ApiError(422, "invalid_request", f"the request does not validate: {err}") from None
    request_id = str(event.event_id)
    published = False
    try:
        with plans.admit():
            future = plans.expect(request_id)
            try:
                await gw.publish(event)
                published = True
                plan = await asyncio.wait_for(future, timeout)
            finally:
                plans.forget(request_id)
    except Busy as err:
        raise ApiError(503, "too_many_waiters", f"{err}; nothing was published") from None
    except Stopping as err:
        told = (
            f"the request stays published and the brain may answer it (GET {API}/jobs/{job}/plan)"
            if published
            else "nothing was published"
        )
        details = {"event_id": request_id}
        raise ApiError(503, "stopping", f"{err}; {told}", details, **{"Retry-After": "1"}) from None
    except TimeoutError:
        raise ApiError(
            504,
            "no_plan_yet",
            f"no OptimizePlan for request {request_id} within {timeout:g} s. The request"
            f" stays published on {gw.env}.job.events and the brain may still answer it"
            f" (GET {API}/jobs/{job}/plan shows it); it publishes none when the"
            " optimizers propose no change or the same one as last time, and dead-letters"
            " a request it cannot route (unknown stage or optimizer, invalid config) to"
            f" {gw.env}.dlq",
            {"event_id": request_id, "job": job},
        ) from None
    return json_response(
        plan.model_dump(mode="json", by_alias=True), headers={"X-Request-Event-Id": request_id}
    )


async def _answer_waiters(app: web.Application) -> None:
    """On the server's shutdown (the sites closed already): long-polls and optimize
    requests are answered now rather than waited for. A job's SDK holds a long-poll at all
    times, and aiohttp would wait for them up to its shutdown timeout, longer than a stop
    may take."""
    gateway = app[GATEWAY]
    gateway.state.close()
    gateway.plans.close()


def build_app(
    gateway: Gateway, *, client_max_size: int = MAX_CONFIG_DOCUMENT_BYTES
) -> web.Application:
    app = web.Application(
        middlewares=[guard],
        client_max_size=client_max_size,
        handler_args={
            "max_line_size": MAX_LINE,
            "max_field_size": MAX_LINE,
            "keepalive_timeout": gateway.limits.header_timeout_s,
            # how long the rest of an unread body is drained before the connection
            # closes (after a 408 too): no longer than a body may take
            "lingering_time": min(gateway.limits.body_timeout_s, 10.0),
        },
    )
    app[GATEWAY] = gateway
    app[METRICS] = gateway_metrics(gateway.registry, gateway)
    app.on_shutdown.append(_answer_waiters)
    r = app.router
    r.add_get("/healthz", healthz, allow_head=False)
    r.add_get("/readyz", readyz, allow_head=False)
    r.add_get("/metrics", metrics_route, allow_head=False)
    r.add_get("/openapi.json", openapi, allow_head=False)
    r.add_get(f"{API}/config", get_config, allow_head=False)
    r.add_get(ADMIN_PREFIX, list_documents, allow_head=False)
    r.add_post(ADMIN_PREFIX, create_document)
    r.add_get(f"{ADMIN_PREFIX}/{{name}}", get_document, allow_head=False)
    r.add_put(f"{ADMIN_PREFIX}/{{name}}", update_document)
    r.add_delete(f"{ADMIN_PREFIX}/{{name}}", delete_document)
    r.add_get(f"{HISTORY_PREFIX}/{{name}}", document_history, allow_head=False)
    r.add_get(f"{API}/jobs/{{job}}/plan", get_plan, allow_head=False)
    r.add_post(f"{API}/jobs/{{job}}/optimize", optimize)
    return app
