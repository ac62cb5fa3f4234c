"""`dlrover-events env settings`: shown, changed, validated, stored with a version and a
history row, announced on dlrover.control; a mistake is one line and exit code 2, and
stores nothing. Real broker, real Postgres, the CLI in its own process."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import CONTROL_TOPIC
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.control import EnvAnnouncement
from tests.conftest import EnvFactory, run_cli, unique_env

pytestmark = pytest.mark.integration


async def _announced(settings: Settings, env: str) -> EnvAnnouncement:
    records = await read_topic(settings, CONTROL_TOPIC)
    found = [decode(r.value) for r in records if r.key == env.encode() and r.value]
    last = found[-1]
    assert isinstance(last, EnvAnnouncement)
    return last


async def test_settings_are_shown_changed_recorded_and_announced(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("s")
    first = tmp_path / "first.yaml"
    first.write_text("brain:\n  running_every: 5\n")
    code, out, err = await run_cli(settings, pg_dsn, "env", "create", env, "--settings", str(first))
    assert code == 0, err
    try:
        code, out, err = await run_cli(settings, pg_dsn, "env", "settings", env)
        assert code == 0, err
        assert out.startswith(f"# env {env}: settings version 1\n")
        assert yaml.safe_load(out) == {"brain": {"running_every": 5}}

        code, out, err = await run_cli(
            settings,
            pg_dsn,
            "env",
            "settings",
            env,
            "--set",
            "brain.limits.max_cpu=16",
            "--set",
            "brain.job_config.optimizer_params.goodput={}",
            "--reason",
            "smaller nodes",
        )
        assert (code, out.strip()) == (0, f"env {env}: settings version 2 stored and announced")
        want = {
            "brain": {
                "running_every": 5,
                "limits": {"max_cpu": 16.0},
                "job_config": {"optimizer_params": {"goodput": {}}},
            }
        }
        code, out, err = await run_cli(settings, pg_dsn, "env", "settings", env, "--json")
        assert code == 0, err
        assert orjson.loads(out) == want
        record = await registry.get(env)
        assert record is not None and (record.settings, record.settings_version) == (want, 2)
        announced = await _announced(settings, env)
        assert (announced.settings, announced.settings_version) == (want, 2)
        assert "smaller nodes" in announced.reason

        # the same change again: nothing to store, nothing announced
        code, out, _ = await run_cli(
            settings, pg_dsn, "env", "settings", env, "--set", "brain.limits.max_cpu=16"
        )
        assert (code, out.strip()) == (0, f"env {env}: settings unchanged (version 2)")

        # --file replaces all of them; --unset takes one back to its default
        second = tmp_path / "second.yaml"
        second.write_text("operator:\n  speed: 2\n")
        code, out, err = await run_cli(
            settings, pg_dsn, "env", "settings", env, "--file", str(second)
        )
        assert code == 0, err
        record = await registry.get(env)
        assert record is not None and record.settings == {"operator": {"speed": 2.0}}
        code, _, err = await run_cli(
            settings, pg_dsn, "env", "settings", env, "--unset", "operator.speed"
        )
        assert code == 0, err
        record = await registry.get(env)
        assert record is not None and (record.settings, record.settings_version) == ({}, 4)

        code, out, err = await run_cli(settings, pg_dsn, "env", "settings", env, "--defaults")
        assert code == 0, err
        shown = yaml.safe_load(out)
        assert shown["brain"]["running_every"] == 8 and shown["operator"]["nodes"] == 16

        changes = [c for c in await registry.changes(env)]
        assert [c["change"] for c in changes] == ["create", "settings", "settings", "settings"]
        assert changes[0]["settings"] == {"brain": {"running_every": 5}}
        assert changes[1]["settings"] == want
        assert changes[1]["reason"].startswith("smaller nodes (set brain.limits.max_cpu=16")
        assert changes[2]["reason"] == "settings from second.yaml"
        assert changes[3]["reason"] == "unset operator.speed"
        code, out, err = await run_cli(settings, pg_dsn, "env", "history", env)
        assert code == 0, err
        assert "settings" in out
    finally:
        await registry.delete(env, force=True)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--set", "brain.limits.max_cpu=-1"],
            "env setting brain.limits.max_cpu: Input should be greater than 0 (got -1)",
        ),
        (["--set", "brain.limits.max_cpus=1"], "env setting brain.limits.max_cpus: Extra inputs"),
        (
            ["--set", "brain.job_config.optimizer_params.goodput.no_such=1"],
            "env setting brain.job_config.optimizer_params.goodput.no_such: Extra inputs",
        ),
        (
            ["--set", "brain.scheduler.name=goodput-cluster"],
            "env setting brain.scheduler.nodes: Field required",
        ),
        (
            ["--set", "brain.scheduler={name: nope, nodes: 1, gpus_per_node: 1}"],
            "env setting brain.scheduler.name: unknown scheduler 'nope'",
        ),
        (["--set", "brain.limits"], "--set 'brain.limits': write it as key.path=value"),
        (["--set", "brain.limits.max_cpu=[1,"], "--set brain.limits.max_cpu: the value is not"),
        (["--unset", "brain.sample_every"], "--unset brain.sample_every: it is not set"),
        (["--file", "/nonexistent/settings.yaml"], "cannot read /nonexistent/settings.yaml"),
    ],
)
async def test_a_mistake_is_one_line_exit_2_and_stores_nothing(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, args: list[str], said: str
) -> None:
    env = (await make_env()).name
    code, out, err = await run_cli(settings, pg_dsn, "env", "settings", env, *args)
    assert code == 2, (out, err)
    assert err.startswith(f"error: {said}")
    assert err.count("\n") == 1 and "Traceback" not in err
    record = await EnvRegistry(settings, pg_dsn).get(env)
    assert record is not None and (record.settings, record.settings_version) == ({}, 1)


async def test_create_refuses_bad_settings_before_making_anything(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    env = unique_env("s")
    bad = tmp_path / "bad.yaml"
    bad.write_text("brain:\n  job_config:\n    optimizer: no-such\n")
    code, _, err = await run_cli(settings, pg_dsn, "env", "create", env, "--settings", str(bad))
    assert code == 2
    assert err.startswith("error: env setting brain.job_config.optimizer: unknown optimizer")
    assert err.count("\n") == 1
    assert await EnvRegistry(settings, pg_dsn).get(env) is None
    code, _, err = await run_cli(settings, pg_dsn, "env", "settings", env)
    assert (code, err.strip()) == (
        2,
        f"error: no env named {env!r} (see `dlrover-events env list`)",
    )
