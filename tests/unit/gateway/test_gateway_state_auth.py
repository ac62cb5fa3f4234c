"""The in-memory state, token parsing and query parsing: no broker, no database."""

from __future__ import annotations

import asyncio

import pytest
from multidict import MultiDict

from dlrover_events.config.matching import make_job
from dlrover_events.envs.tokens import Scope, grants, hash_token, new_token, token_env
from handlers.gateway.app import ApiError, parse_job
from handlers.gateway.openapi import openapi_document
from handlers.gateway.state import GatewayState
from schemas.config import ConfigChange, ConfigDocument


def upsert(name: str, version: int, user: str = "u", **conf: object) -> ConfigChange:
    doc = ConfigDocument(name=name, version=version, include={"user": user}, configure=conf)
    return ConfigChange(env="e", op="upsert", name=name, version=version, document=doc)


def delete(name: str, version: int) -> ConfigChange:
    return ConfigChange(env="e", op="delete", name=name, version=version)


JOB = make_job({"user": "u"})


async def test_apply_upserts_deletes_and_tombstones() -> None:
    state = GatewayState("e")
    assert state.apply([upsert("a", 1, x=1), upsert("b", 1, y=2)]) == 2
    assert state.answer(JOB).body.startswith(b'{"env":"e"')
    assert set(state.index.resolve(JOB).config) == {"x", "y"}
    assert state.apply([delete("a", 2)]) == 1
    assert state.index.resolve(JOB).config == {"y": 2}
    assert state.apply([("b", None)]) == 1  # a Kafka tombstone
    assert len(state.index) == 0
    assert state.versions == {"a": 2}


async def test_replays_keep_the_cache_and_the_last_change_wins() -> None:
    state = GatewayState("e")
    state.apply([upsert("a", 1, x=1)])
    first = state.answer(JOB)
    assert state.apply([upsert("a", 1, x=1)]) == 0  # exact replay
    assert state.answer(JOB) is first
    # Reconcile may put back an older version over one whose commit failed.
    state.apply([upsert("a", 3, x=3), upsert("a", 2, x=2)])
    assert state.index.resolve(JOB).config == {"x": 2}
    assert state.answer(JOB).etag != first.etag


async def test_wait_for_change_wakes_on_change_or_times_out() -> None:
    state = GatewayState("e")
    state.apply([upsert("a", 1, x=1)])
    etag = state.answer(JOB).etag
    same = await state.wait_for_change(JOB, {etag}, 0.05)
    assert same.etag == etag
    waiting = asyncio.create_task(state.wait_for_change(JOB, {etag}, 10))
    await asyncio.sleep(0.01)
    state.apply([upsert("other", 1, user="z")])  # changes the index, not this job's answer
    await asyncio.sleep(0.01)
    assert not waiting.done()
    state.apply([upsert("a", 2, x=2)])
    changed = await asyncio.wait_for(waiting, 5)
    assert changed.etag != etag


async def test_closing_answers_config_long_polls_at_once() -> None:
    """The gateway stops: a long-poll gets the answer it has, now, and a new one does not
    wait (the HTTP server's shutdown would otherwise sit out their waits)."""
    state = GatewayState("e")
    state.apply([upsert("a", 1, x=1)])
    etag = state.answer(JOB).etag
    waiting = asyncio.create_task(state.wait_for_change(JOB, {etag}, 60))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    state.close()
    assert (await asyncio.wait_for(waiting, 1)).etag == etag
    assert (await asyncio.wait_for(state.wait_for_change(JOB, {etag}, 60), 1)).etag == etag


def test_tokens_name_their_env_and_hash() -> None:
    token_id, token = new_token("prod-2")
    assert token.startswith(f"dle.prod-2.{token_id}.")
    assert token_env(token) == "prod-2"
    assert token_env("not-a-token") is None
    assert len(hash_token(token)) == 64
    assert hash_token(token) != hash_token(token + "x")
    assert grants(["read"], Scope.READ)
    assert not grants(["read"], Scope.ADMIN)
    assert grants(["admin"], Scope.READ)


def test_query_becomes_job_attributes() -> None:
    job, wait = parse_job(
        MultiDict(
            [("User", "u"), ("labels.Team", "a"), ("group", "g1"), ("GROUP", "g2"), ("wait", "2.5")]
        )
    )
    assert wait == 2.5
    assert job == {"user": {"u"}, "labels.team": {"a"}, "group": {"g1", "g2"}}
    for bad in (
        [("wait", "-1")],
        [("wait", "61")],
        [("wait", "x")],
        [("", "v")],
        [("u", "x" * 300)],
        [(f"k{i}", "v") for i in range(65)],
    ):
        with pytest.raises(ApiError) as err:
            parse_job(MultiDict(bad))
        assert err.value.status == 400


def test_openapi_names_every_status_the_admin_routes_use() -> None:
    doc = openapi_document()
    put = doc["paths"]["/v1/documents/{name}"]["put"]
    assert {"200", "400", "401", "403", "404", "409", "422", "428", "503"} <= set(put["responses"])
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    schema = doc["components"]["schemas"]["ConfigDocument"]
    assert {"Include", "Exclude", "Configure"} <= set(schema["properties"])
