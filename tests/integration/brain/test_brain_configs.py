"""The brain's copy of the env's config documents, read from the real broker: the backlog
before it is caught up, then live changes, deletions and tombstones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import CONFIG_CHANGES, topic
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from schemas.config import ConfigChange, ConfigDocument
from schemas.jobs import JobMeta
from streams.brain.runtime.configs import ConfigFollower
from tests.conftest import EnvFactory, unique_env

pytestmark = pytest.mark.integration

ALICE = JobMeta(uuid="job-a", user="alice", labels={"team": "speech"})
BOB = JobMeta(uuid="job-b", user="bob")


def upsert(
    env: str, name: str, version: int, include: dict[str, str], **conf: object
) -> ConfigChange:
    doc = ConfigDocument(name=name, version=version, include=include, configure=conf)
    return ConfigChange(env=env, op="upsert", name=name, version=version, document=doc)


async def until(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


async def test_documents_reach_the_index_and_leave_it(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    name = topic(env, CONFIG_CHANGES)
    async with Producer(settings) as producer:
        # The backlog: documents keyed to several partitions, and a record that is none.
        await producer.publish_many(
            [
                upsert(env, f"team-{i}", 1, {"labels.team": "speech"}, **{f"k{i}": i})
                for i in range(6)
            ]
            + [upsert(env, "alice", 2, {"user": "alice"}, optimizer="goodput")]
        )
        await producer.send_raw(name, b"not an event", b"junk")
        async with ConfigFollower(settings, env) as follower:
            await follower.caught_up(30)
            assert follower.is_caught_up
            assert follower.rejected == 1
            assert follower.index.config_for(ALICE) == {
                "optimizer": "goodput",
                **{f"k{i}": i for i in range(6)},
            }
            assert follower.index.config_for(BOB) == {}

            # Live: a change, a delete, a Kafka tombstone.
            await producer.publish(
                upsert(
                    env,
                    "alice",
                    3,
                    {"user": "alice"},
                    optimizer="goodput",
                    optimizer_params={"goodput": {"max_workers": 4}},
                )
            )
            await until(lambda: "optimizer_params" in follower.index.config_for(ALICE))
            assert follower.index.config_for(ALICE)["optimizer_params"] == {
                "goodput": {"max_workers": 4}
            }
            await producer.publish(ConfigChange(env=env, op="delete", name="alice", version=4))
            await until(lambda: "optimizer" not in follower.index.config_for(ALICE))
            for i in range(6):
                await producer.send_raw(name, None, f"team-{i}".encode())
            await until(lambda: len(follower.index) == 0)
            assert follower.index.config_for(ALICE) == {}


async def test_an_empty_topic_is_caught_up_at_once(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    async with ConfigFollower(settings, env) as follower:
        await follower.caught_up(10)
        assert len(follower.index) == 0


async def test_an_env_without_the_topic_is_a_user_error(settings: Settings) -> None:
    with pytest.raises(UserError, match="does not exist"):
        async with ConfigFollower(settings, unique_env()):
            pass
