"""`dlrover-events bootstrap` outside a cluster (tokens in files), run as a user runs it:
a fresh install is set up, a re-run changes nothing and says so, a kept token is never
minted again unless --rotate, and a token revoked on purpose is replaced."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
import pytest

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.topics import ENV_TOPICS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.tokens import Scope, Tokens, token_id_of
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.store.database import env_schema, quote_ident
from schemas.control import EnvMode
from tests.conftest import REPO, cli_environ, unique_env

pytestmark = pytest.mark.integration

SETTINGS_YAML = "brain:\n  job_config:\n    optimizer: worker-resource\n"


async def bootstrap(environ: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from dlrover_events.cli.app import main; main()",
        "bootstrap",
        *args,
        cwd=REPO,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def verdict(dsn: str, env: str, token: str, scope: Scope) -> int:
    store = await EnvStore.open(dsn, env, max_size=1)
    try:
        return (await Tokens(store.pool, env).verify(f"Bearer {token}", scope)).status
    finally:
        await store.close()


async def test_bootstrap_sets_up_an_install_once(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    conf = own_settings
    environ = cli_environ(conf, own_pg)
    real, standby = unique_env("prod"), unique_env("standby")
    (tmp_path / "settings.yaml").write_text(SETTINGS_YAML)
    tokens = tmp_path / "tokens"
    args = [
        "--env",
        real,
        "--standby",
        standby,
        "--settings",
        str(tmp_path / "settings.yaml"),
        "--tokens-dir",
        str(tokens),
    ]

    code, out = await bootstrap(environ, *args)
    assert code == 0, out
    registry = EnvRegistry(conf, own_pg)
    made = {e.name: e for e in await registry.list()}
    assert made[real].mode == EnvMode.REAL and made[standby].mode == EnvMode.VIRTUAL
    for name in (real, standby):
        assert made[name].settings == {"brain": {"job_config": {"optimizer": "worker-resource"}}}
    async with TopicAdmin(conf) as admin:
        present = set(await admin.list_topics())
    assert {topic(n, t.name) for n in (real, standby) for t in ENV_TOPICS} <= present
    kept = {}
    for name in (real, standby):
        for scope in Scope:
            path = tokens / f"{name}.{scope.value}.token"
            assert path.stat().st_mode & 0o777 == 0o600, "a token file is the owner's only"
            kept[name, scope] = path.read_text().strip()
            assert await verdict(own_pg, name, kept[name, scope], scope) == 200
    assert await verdict(own_pg, real, kept[real, Scope.READ], Scope.ADMIN) == 403, (
        "the training pods' token reads, nothing more"
    )
    assert out.strip().endswith("changes)"), out

    # again: nothing changes, and it says so
    code, out = await bootstrap(environ, *args)
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "bootstrap: nothing to do (everything was in place)"
    assert {(n, s): (tokens / f"{n}.{s.value}.token").read_text().strip() for n, s in kept} == kept

    # a token revoked on purpose is replaced, the others are kept
    store = await EnvStore.open(own_pg, real, max_size=1)
    try:
        revoked = token_id_of(kept[real, Scope.READ])
        assert revoked is not None and await Tokens(store.pool, real).revoke(revoked)
    finally:
        await store.close()
    code, out = await bootstrap(environ, *args)
    assert code == 0, out
    assert f"read token of {real}: the kept one was revoked: minted anew" in out, out
    assert "bootstrap: done (1 changes)" in out, out
    replaced = (tokens / f"{real}.read.token").read_text().strip()
    assert replaced != kept[real, Scope.READ]
    assert await verdict(own_pg, real, replaced, Scope.READ) == 200
    assert (tokens / f"{real}.admin.token").read_text().strip() == kept[real, Scope.ADMIN]

    # --rotate: every token anew, the old ones revoked
    code, out = await bootstrap(environ, *args, "--rotate")
    assert code == 0, out
    for name, scope in kept:
        new = (tokens / f"{name}.{scope.value}.token").read_text().strip()
        assert new not in (kept[name, scope], replaced)
        assert await verdict(own_pg, name, new, scope) == 200
        assert await verdict(own_pg, name, kept[name, scope], scope) == 401


async def test_bootstrap_keeps_settings_changed_since_unless_told(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    """A re-run does not undo `env settings` (live tuning); --apply-settings does, through
    the same registry change, and then has nothing more to do."""
    conf = own_settings
    environ = cli_environ(conf, own_pg)
    real = unique_env("prod")
    (tmp_path / "settings.yaml").write_text(SETTINGS_YAML)
    args = ["--env", real, "--settings", str(tmp_path / "settings.yaml")]
    args += ["--tokens-dir", str(tmp_path / "tokens")]
    code, out = await bootstrap(environ, *args)
    assert code == 0, out
    given = {"brain": {"job_config": {"optimizer": "worker-resource"}}}
    tuned = {"brain": {"job_config": {"optimizer": "goodput"}}}
    registry = EnvRegistry(conf, own_pg)
    await registry.change_settings(real, lambda _: tuned, reason="tuned by hand")

    code, out = await bootstrap(environ, *args)
    assert code == 0, out
    assert f"env {real}: its settings differ from those given: left as they are" in out
    assert out.strip().splitlines()[-1] == "bootstrap: nothing to do (everything was in place)"
    record = await registry.get(real)
    assert record is not None and record.settings == tuned

    code, out = await bootstrap(environ, *args, "--apply-settings")
    assert code == 0, out
    assert f"env {real}: settings changed to those given (version 3)" in out, out
    assert out.strip().splitlines()[-1] == "bootstrap: done (1 changes)"
    record = await registry.get(real)
    assert record is not None and record.settings == given

    code, out = await bootstrap(environ, *args, "--apply-settings")
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "bootstrap: nothing to do (everything was in place)"


async def test_bootstrap_registers_kept_tokens_in_a_new_database(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    """A database made anew (its envs gone, the topics and the kept tokens still there)
    keeps the tokens that pods hold."""
    conf = own_settings
    real = unique_env("prod")
    tokens = tmp_path / "tokens"
    args = ["--env", real, "--tokens-dir", str(tokens)]
    code, out = await bootstrap(cli_environ(conf, own_pg), *args)
    assert code == 0, out
    held = (tokens / f"{real}.read.token").read_text().strip()

    conn = await asyncpg.connect(own_pg)
    try:
        await conn.execute(
            f"DROP SCHEMA dlrover CASCADE; DROP SCHEMA {quote_ident(env_schema(real))} CASCADE"
        )
    finally:
        await conn.close()
    code, out = await bootstrap(cli_environ(conf, own_pg), *args)
    assert code == 0, out
    assert f"read token of {real}: the one in {tokens}/{real}.read.token registered again" in out
    assert (tokens / f"{real}.read.token").read_text().strip() == held
    assert await verdict(own_pg, real, held, Scope.READ) == 200


async def test_bootstrap_refuses_a_second_real_env(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    conf = own_settings
    environ = cli_environ(conf, own_pg)
    first = unique_env("prod")
    code, out = await bootstrap(environ, "--env", first, "--tokens-dir", str(tmp_path))
    assert code == 0, out
    second = unique_env("prod")
    code, out = await bootstrap(environ, "--env", second, "--tokens-dir", str(tmp_path))
    assert code == 2
    assert out.strip().splitlines()[-1] == (
        f"error: env {first!r} is the real env already; bootstrap it (--env {first}) "
        f"or promote {second!r} later (`env promote`)"
    )


async def test_bootstrap_makes_a_missing_standby_with_the_real_env_s_settings(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    """A standby given no settings of its own is made as the real env is now (tuned since
    with `env settings` too): the env that takes over decides as the real env did (issue 38)."""
    conf = own_settings
    environ = cli_environ(conf, own_pg)
    real, standby = unique_env("prod"), unique_env("standby")
    tokens = ["--tokens-dir", str(tmp_path / "tokens")]
    code, out = await bootstrap(environ, "--env", real, *tokens)
    assert code == 0, out
    tuned = {"brain": {"job_config": {"optimizer": "goodput"}}}
    registry = EnvRegistry(conf, own_pg)
    await registry.change_settings(real, lambda _: tuned, reason="tuned by hand")
    code, out = await bootstrap(environ, "--env", real, "--standby", standby, *tokens)
    assert code == 0, out
    record = await registry.get(standby)
    assert record is not None and record.mode == EnvMode.VIRTUAL
    assert record.settings == tuned
