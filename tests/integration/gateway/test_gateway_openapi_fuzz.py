"""schemathesis against a running gateway's /openapi.json, on the real broker and Postgres.

What the OpenAPI document promises is what clients (and the SDK) are built on: no input
may get a 5xx, and every answer must have a declared status, content type, headers and
body schema. Bounded examples, so it is part of every run, not a separate chore.

schemathesis drives the gateway synchronously (requests), so the gateway gets an event
loop of its own in a thread, with its env made there too.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import SecretStr

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.gateway.openapi import JOB_EXAMPLE, openapi_document
from handlers.gateway.runtime import GatewayServer
from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobMeta, JobSubmitted
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import unique_env
from tests.integration.gateway.conftest import gateway_settings

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).with_name("schemathesis.toml")
#: Per operation; the 13 operations take seconds, well under a minute on 2 cores.
MAX_EXAMPLES = 30
START_TIMEOUT_S = 60
#: The gateway's bootstrap admin token (Settings.admin_token), known before collection so
#: schemathesis holds it as the API's credentials: its auth checks then remove or spoil
#: it themselves, which headers added at call time would silently put back.
TOKEN = secrets.token_urlsafe(24)
#: What a schema-valid document may still break (the bounds are stated in the document's
#: description; JSON Schema cannot state a depth or a count of values).
DOCUMENT_RULES = ("NUL", "name the same attribute", "int64", "nests deeper", "values")
#: The rejections of schema-valid requests schemathesis.toml allows, each as what the
#: error must then say: (method, path, status) -> (error code, what the message names).
DELIBERATE = {
    ("POST", "/v1/documents", 422): ("invalid_document", DOCUMENT_RULES),
    ("PUT", "/v1/documents/{name}", 422): ("invalid_document", DOCUMENT_RULES),
    ("PUT", "/v1/documents/{name}", 400): ("name_mismatch", ("but the URL names",)),
    ("POST", "/v1/jobs/{job}/optimize", 422): ("invalid_request", ("NUL",)),
    ("POST", "/v1/jobs/{job}/optimize", 409): ("job_finished", ("finished",)),
}
JOBS = "/v1/jobs/"


def seeded(env: str) -> list[Event]:
    """The fuzzed env's one job (the document's example uuid), finished: its plan has
    every part, and an optimize request for it is answered at once (409), not after a
    wait for a brain that is not running."""
    job = JobMeta(uuid=JOB_EXAMPLE, name="fuzzed")
    plan = ScalePlan(env=env, job=job, plan_id="p1", training={"local_batch_size": 8})
    return [
        JobSubmitted(env=env, job=job),
        plan,
        ScaleResult(env=env, job=job, plan_id="p1", status=ScaleStatus.APPLIED),
        JobCompleted(env=env, job=job),
    ]


class GatewayThread(threading.Thread):
    """A gateway with its own env and loop, so synchronous clients can drive it."""

    def __init__(self, settings: Settings, pg_dsn: str) -> None:
        super().__init__(name="gateway-under-fuzz", daemon=True)
        self.settings = settings.model_copy(update={"admin_token": SecretStr(TOKEN)})
        self.pg_dsn = pg_dsn
        self.started = threading.Event()
        self.url: str | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:
            self.error = err
        finally:
            self.started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        registry = EnvRegistry(self.settings, self.pg_dsn)
        env = (await registry.create(unique_env("fz"), partitions=1)).name
        try:
            async with Producer(self.settings) as producer:
                await producer.publish_many(seeded(env))
            async with GatewayServer(self.settings, env, self.pg_dsn, gateway_settings()) as gw:
                await gw.wait_ready(START_TIMEOUT_S)
                self.url = gw.url
                self.started.set()
                await self._halt.wait()
        finally:
            await registry.delete(env, force=True)

    def stop(self) -> None:
        if self._loop is not None and self._halt is not None:
            self._loop.call_soon_threadsafe(self._halt.set)
        self.join(START_TIMEOUT_S)


@pytest.fixture
def served(settings: Settings, pg_dsn: str) -> Iterator[str]:
    """The URL of a running gateway that serves exactly the document being fuzzed."""
    thread = GatewayThread(settings, pg_dsn)
    thread.start()
    try:
        assert thread.started.wait(START_TIMEOUT_S), "the gateway did not start"
        if thread.error is not None:
            raise thread.error
        assert thread.url is not None
        got = requests.get(
            f"{thread.url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        assert got.status_code == 200
        assert got.json() == openapi_document(), "the fuzzed schema is not the one served"
        yield thread.url
    finally:
        thread.stop()
    if thread.error is not None:
        raise thread.error


def load_schema() -> schemathesis.BaseSchema:
    """The gateway's OpenAPI document, tuned as schemathesis.toml says (the file `st run`
    reads), with the admin token as the API's credentials.

    Loaded at collection from the code that serves /openapi.json (``served`` checks the
    running gateway serves exactly this): schemathesis's fixture-loaded schemas rely on
    a pytest internal (``Node._nodeid``) that pytest 9.2 no longer has.
    """
    data = tomllib.loads(CONFIG.read_text())
    data["auth"] = {"openapi": {"bearer": {"bearer": TOKEN}}}
    data.setdefault("generation", {})["max-examples"] = MAX_EXAMPLES
    config = schemathesis.Config.from_dict(data, base_dir=str(CONFIG.parent))
    return schemathesis.openapi.from_dict(openapi_document(), config=config)


schema = load_schema()


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_gateway_keeps_what_its_openapi_document_promises(
    case: schemathesis.Case, served: str
) -> None:
    # Every check enabled by default (no 5xx, declared statuses, content types, headers
    # and response schemas, invalid input rejected, valid input accepted, auth enforced),
    # tuned only where schemathesis.toml says why.
    response = case.call_and_validate(base_url=served)
    path = case.operation.path
    deliberate = DELIBERATE.get((case.method.upper(), path, response.status_code))
    positive = case.meta is not None and (
        case.meta.generation.mode == schemathesis.GenerationMode.POSITIVE
    )
    if deliberate is not None and positive:
        code, reasons = deliberate
        error = response.json()["error"]
        assert error["code"] == code, error
        assert any(r in error["message"] for r in reasons), error
    if path.startswith(JOBS) and response.status_code == 404:
        # a job the env does not know, said so (not "no such route")
        error = response.json()["error"]
        assert error["code"] == "unknown_job" and error["message"], error
    if path.startswith(JOBS) and positive and case.path_parameters == {"job": JOB_EXAMPLE}:
        assert response.status_code in (200, 304, 400, 409, 422), response.text
