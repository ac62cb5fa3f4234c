from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.bus.topics import (
    CONTROL_TOPIC,
    ENV_TOPIC_NAMES,
    check_env_name,
    env_topics,
    split_topic,
    topic,
    topic_of,
)
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from dlrover_events.store.database import env_schema
from dlrover_events.store.migrations import load_migrations
from schemas import EnvAnnouncement, EnvMode, JobMeta, NodeOOM, OOMKind, RuntimeSample, ScalePlan
from schemas.jobs import NodeRef


def test_events_go_to_their_env_topic() -> None:
    job = JobMeta(uuid="j")
    assert topic_of(RuntimeSample(env="prod", job=job, global_step=1)) == "prod.job.metrics"
    oom = NodeOOM(env="a-b", job=job, node=NodeRef(type="worker", id=0), kind=OOMKind.GPU_MEMORY)
    assert topic_of(oom) == "a-b.job.events"
    assert topic_of(ScalePlan(env="x", job=job, plan_id="p")) == "x.scale.plans"
    ann = EnvAnnouncement(env="x", name="x", mode=EnvMode.REAL, partitions=1)
    assert topic_of(ann) == CONTROL_TOPIC == "dlrover.control"


def test_env_topics_are_prefixed_and_complete() -> None:
    names = env_topics("shadow-a")
    assert names == [f"shadow-a.{t}" for t in ENV_TOPIC_NAMES]
    assert "shadow-a.dlq" in names and "shadow-a.config.changes" in names
    assert split_topic("shadow-a.job.metrics") == ("shadow-a", "job.metrics")


@pytest.mark.parametrize("bad", ["", "Prod", "1env", "env_x", "a" * 32, "prod.x", "-x"])
def test_bad_env_names_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError, match="must match"):
        check_env_name(bad)


@given(st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z"))
def test_valid_env_names_give_valid_topics_and_schemas(name: str) -> None:
    assert topic(name, "dlq") == f"{name}.dlq"
    schema = env_schema(name)
    assert schema.startswith("env_") and "-" not in schema


def test_unknown_topic_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown topic"):
        topic("prod", "job.metricz")


def test_migrations_are_ordered_and_versioned() -> None:
    for kind in ("registry", "env"):
        migs = load_migrations(kind)  # type: ignore[arg-type]
        assert migs, kind
        assert [m.version for m in migs] == sorted({m.version for m in migs})
        assert all(m.sql.strip() for m in migs)


def test_settings_from_env_then_toml_then_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "dlrover-events.toml"
    cfg.write_text('bootstrap_servers = "10.0.0.9:9092"\npartitions = 6\n')
    monkeypatch.setenv("DLROVER_EVENTS_CONFIG", str(cfg))
    monkeypatch.setenv("DLROVER_EVENTS_PARTITIONS", "12")
    s = Settings()
    assert s.bootstrap_servers == "10.0.0.9:9092"  # from the file
    assert s.partitions == 12  # the environment wins over the file
    assert s.enable_idempotence is False  # tansu has none: off by default
    assert s.host == "127.0.0.1"
