"""/v1/experiments on a real broker and Postgres, with the experiments recorder running, as
a notebook drives it: an admin token; a document published as submitted; read back once
recorded, with its trials, rungs and metrics; paused, activated, killed; a 4xx with a
message (and the field) for every mistake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import EXPERIMENTS, topic
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from handlers.experiments.http import PREFIX, experiments_app
from schemas.codec import decode
from schemas.experiments import DecisionKind, ExperimentSubmitted
from streams.searcher import recorder
from tests.conftest import EnvFactory
from tests.integration.experiments.test_recorder import report, told
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

Call = Callable[..., Awaitable[tuple[int, Any]]]


@dataclass
class Api:
    env: str
    call: Call
    admin: dict[str, str]
    reader: dict[str, str]
    producer: Producer

    async def until(self, path: str, ok: Callable[[Any], bool]) -> Any:
        """The answer of GET ``path`` once ``ok`` holds (the recorder stored it)."""
        async with asyncio.timeout(30):
            while True:
                status, body = await self.call("GET", path, self.admin)
                if status == 200 and ok(body):
                    return body
                await asyncio.sleep(0.1)


@pytest.fixture
async def api(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Api]:
    env = (await make_env()).name
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    tokens = Tokens(pool, env)
    _, admin = await tokens.mint("test-admin", [Scope.ADMIN])
    _, reader = await tokens.mint("test-reader", [Scope.READ])
    ctx = ServiceContext(settings, env, pg_dsn)
    recording = asyncio.create_task(recorder.run(ctx))
    root = web.Application()  # as the local platform's server mounts it beside /v1/jobs
    async with Producer(settings) as producer:
        root.add_subapp(PREFIX, experiments_app(ExperimentStore(pool), tokens, producer, env))
        server = TestServer(root, host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession(str(server.make_url(""))) as http:

                async def call(
                    method: str, path: str, headers: dict[str, str], **kw: Any
                ) -> tuple[int, Any]:
                    async with http.request(method, path, headers=headers, **kw) as r:
                        return r.status, await r.json()

                yield Api(
                    env,
                    call,
                    {"Authorization": f"Bearer {admin}"},
                    {"Authorization": f"Bearer {reader}"},
                    producer,
                )
        finally:
            await server.close()
            ctx.stop.set()
            await recording
            await pool.close()


async def test_an_experiment_over_http(api: Api, settings: Settings) -> None:
    call, admin = api.call, api.admin
    status, body = await call("GET", PREFIX, {})
    assert status == 401 and "bearer token" in body["error"]
    status, body = await call("GET", PREFIX, api.reader)
    assert status == 403 and "admin" in body["error"]

    status, body = await call("POST", PREFIX, admin, json=document("sweep"))
    assert status == 201, body
    assert (body["name"], body["env"], body["status"]) == ("sweep", api.env, "submitted")
    assert body["spec"]["searcher"]["name"] == "asha"
    published = [decode(r.value) for r in await read_topic(settings, topic(api.env, EXPERIMENTS))]
    assert [(type(e), e.source, str(e.event_id)) for e in published] == [
        (ExperimentSubmitted, "api", body["event_id"])
    ]
    listed = await api.until(PREFIX, lambda b: len(b["experiments"]) == 1)
    assert listed["experiments"][0]["status"] == "active"
    status, body = await call("POST", PREFIX, admin, json=document("sweep"))
    assert status == 409 and "already has an experiment named 'sweep'" in body["error"]

    # what its searcher decided and its trials reported, read back
    await api.producer.publish_many(
        [
            told(api.env, "sweep", 0, DecisionKind.CREATE, 0, hparams={"lr": 0.1}, budget=10),
            told(api.env, "sweep", 1, DecisionKind.CREATE, 1, hparams={"lr": 0.2}, budget=10),
            report(api.env, "sweep", 0, 5, 2.0),
            report(api.env, "sweep", 0, 10, 0.5, validation=True),
            report(api.env, "sweep", 1, 10, 0.7, validation=True),
        ]
    )
    path = f"{PREFIX}/sweep"
    seen = await api.until(path, lambda b: b["best_trial"] is not None and len(b["trials"]) == 2)
    assert seen["best_trial"]["trial"] == 0 and seen["ranking"] == [0, 1]
    assert seen["trials"][0]["decisions"][0]["decision"] == "create"
    status, body = await call("GET", f"{path}/trials/0/metrics", admin)
    assert status == 200 and [(m["step"], m["validation"]) for m in body["metrics"]] == [
        (5, False),
        (10, True),
    ]
    assert body["metrics"][0]["metrics"] == {"loss": 2.0, "lr": 0.1}
    status, body = await call("GET", f"{path}/trials/x/metrics", admin)
    assert status == 400 and body["field"] == "trial"
    status, body = await call("GET", f"{PREFIX}/nope", admin)
    assert status == 404 and "nope" in body["error"]
    status, body = await call("GET", f"{PREFIX}/nope/trials/0/metrics", admin)
    assert status == 404

    # steered: each action published, the status follows once recorded
    status, body = await call("POST", f"{path}/pause", admin, json={"reason": "lunch"})
    assert status == 202 and body["action"] == "pause"
    seen = await api.until(path, lambda b: b["status"] == "paused")
    assert seen["status_reason"] == "lunch"
    status, body = await call("POST", f"{path}/activate", admin)
    assert status == 202
    await api.until(path, lambda b: b["status"] == "active")
    status, body = await call("POST", f"{path}/pause", admin, json={"why": "x"})
    assert status == 422 and body["field"] == "reason"
    status, body = await call("POST", f"{path}/pause", admin, json={"reason": "x" * 2000})
    assert status == 422 and body["field"] == "reason"
    status, body = await call("POST", f"{path}/kill", admin)
    assert status == 202
    await api.until(path, lambda b: b["status"] == "killed")
    status, body = await call("POST", f"{path}/activate", admin)
    assert status == 409 and "killed" in body["error"]
    status, body = await call("POST", f"{PREFIX}/nope/kill", admin)
    assert status == 404
    status, body = await call("POST", f"{path}/restart", admin)
    assert status in (404, 405)  # no such action: no route


async def test_bad_documents_are_4xx_naming_the_field(api: Api) -> None:
    call, admin = api.call, api.admin
    status, body = await call("POST", PREFIX, admin, data=b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = await call("POST", PREFIX, admin, json=document(metirc="x"))
    assert status == 422
    assert body == {"error": "spec.searcher.metirc: unknown field", "field": "spec.searcher.metirc"}
    bad = document()
    bad["spec"]["hyperparameters"]["width"]["minval"] = "eight"
    status, body = await call("POST", PREFIX, admin, json=bad)
    assert status == 422 and body["field"] == "spec.hyperparameters.width.minval"
    status, body = await call("POST", PREFIX, admin, json=[1, 2])
    assert status == 422 and body["field"] == "" and "mapping" in body["error"]
    status, body = await call("POST", PREFIX, admin, data=b"[" * 100_000)
    assert status == 400
    status, body = await call("POST", PREFIX, admin, data=b"x" * (300 * 1024))
    assert status == 413
    status, body = await call("GET", PREFIX, admin)
    assert status == 200 and body == {"experiments": []}
