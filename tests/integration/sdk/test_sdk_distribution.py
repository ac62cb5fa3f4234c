"""The SDK as a light install: ``sdk/pyproject.toml`` built and installed alone into a fresh
venv, which then reports a sample to the session's broker.

The wheels it needs (its dependencies and the build backend) are kept in a wheelhouse under
``~/.cache/dlrover-events`` (like the Kubernetes test environment), filled from the package
index the first time or when the SDK's dependencies change; after that the build and the
install run offline, in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_METRICS, topic
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.jobs import RuntimeSample
from tests.conftest import REPO, EnvFactory

pytestmark = pytest.mark.integration

WHEELHOUSE = Path.home() / ".cache" / "dlrover-events" / "sdk-wheelhouse"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
#: What a training pod must not get with the SDK.
HEAVY = ["faust", "asyncpg", "kubernetes_asyncio", "scipy", "matplotlib", "typer", "torch"]

SCRIPT = r"""
import importlib.util, json, sys
heavy = sys.argv[1].split(",")
assert not [m for m in heavy if importlib.util.find_spec(m)], "installed: " + str(
    [m for m in heavy if importlib.util.find_spec(m)])
for absent in ("streams", "handlers", "dlrover_events.store", "dlrover_events.cli",
               "dlrover_events.runtime"):
    assert importlib.util.find_spec(absent) is None, absent
from importlib.metadata import entry_points
# torchrun finds the SDK's rendezvous by this (sdk/torch/rendezvous_entry.py)
(rdzv,) = entry_points(group="torchrun.handlers")
assert rdzv.name == "dlrover-c10d", rdzv
# every module the distribution installed imports with it alone (torch's need the extra;
# the bench is the full install's): a file the SDK needs and lacks fails here
import importlib
from importlib.metadata import files
modules = sorted(
    ".".join(f.with_suffix("").parts).removesuffix(".__init__")
    for f in files("dlrover-events-sdk") or []
    if f.suffix == ".py" and f.parts[0] in ("dlrover_events", "schemas")
)
skipped = ("dlrover_events.sdk.torch", "dlrover_events.sdk.bench")
checked = [m for m in modules if not m.startswith(skipped)]
assert len(checked) > 30, checked
for name in checked:
    importlib.import_module(name)
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.config.client import SyncConfigClient
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta
reporter = Reporter(
    JobIdentity(job=JobMeta(uuid=sys.argv[3]), env=sys.argv[2]),
    settings=Settings(bootstrap_servers=sys.argv[4]),
    interval_s=0.05,
    local_batch_size=8,
).start()
for _ in range(20):
    reporter.step(samples=8)
flushed = reporter.flush(20.0)
stats = reporter.close(5.0)
print(json.dumps({"flushed": flushed, "published": stats.published, "dropped": stats.dropped}))
"""


def run(cmd: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def build_offline(out: Path) -> subprocess.CompletedProcess[str]:
    return run([*PIP, "wheel", "-q", "--no-deps", "--no-index", "--find-links", str(WHEELHOUSE),
                "-w", str(out), str(REPO / "sdk")])  # fmt: skip


def install_offline(venv: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    return run([*PIP, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-index",
                "--find-links", str(WHEELHOUSE), str(wheel)])  # fmt: skip


def refresh_wheelhouse() -> None:
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    done = run([*PIP, "wheel", "-q", "-w", str(WHEELHOUSE), str(REPO / "sdk"), "hatchling"], 600)
    assert done.returncode == 0, f"cannot fill the SDK's wheelhouse from the index: {done.stderr}"


def install_and_report(tmp_path: Path, env: str, job: str, servers: str) -> dict[str, object]:
    out, venv = tmp_path / "dist", tmp_path / "venv"
    built = build_offline(out)
    if built.returncode != 0:
        refresh_wheelhouse()
        built = build_offline(out)
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("dlrover_events_sdk-*.whl")
    with zipfile.ZipFile(wheel) as built_wheel:  # its page on an index is sdk/README.md
        (metadata,) = [n for n in built_wheel.namelist() if n.endswith(".dist-info/METADATA")]
        described = built_wheel.read(metadata).decode()
    assert "Description-Content-Type: text/markdown" in described
    assert (REPO / "sdk" / "README.md").read_text().strip() in described
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    installed = install_offline(venv, wheel)
    if installed.returncode != 0:  # the SDK's dependencies changed since the cache was filled
        refresh_wheelhouse()
        installed = install_offline(venv, wheel)
    assert installed.returncode == 0, installed.stderr

    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-c", SCRIPT, ",".join(HEAVY), env, job, servers],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repository: only what the venv holds can be imported
        env=environ,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stats: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return stats


async def test_the_sdk_installs_alone_and_reports(
    tmp_path: Path, settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = f"dist-{env}"
    stats = await asyncio.to_thread(
        install_and_report, tmp_path, env, job, settings.bootstrap_servers
    )
    assert stats["flushed"] and stats["dropped"] == 0
    published = stats["published"]
    assert isinstance(published, int) and published >= 1

    records = await read_topic(settings, topic(env, JOB_METRICS), timeout_s=10)
    samples = [e for e in (decode(r.value) for r in records) if isinstance(e, RuntimeSample)]
    assert {s.job.uuid for s in samples} == {job}
    assert len({s.event_id for s in samples}) == published


def stand_in_torch(folder: Path, version: str) -> Path:
    """A distribution named torch at ``version`` that holds nothing but its metadata: what
    pip weighs when it resolves the SDK's ``torch`` extra. (A real torch other than the
    suite's is gigabytes; the SDK's torch code runs on the suite's own torch elsewhere.)"""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as out:
        for name, text in files.items():
            out.writestr(name, text)
        out.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return wheel


def test_the_sdk_keeps_a_torch_of_its_range_and_refuses_one_below_it(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    built = build_offline(out)
    if built.returncode != 0:
        refresh_wheelhouse()
        built = build_offline(out)
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("dlrover_events_sdk-*.whl")

    def venv_with_torch(version: str) -> tuple[Path, Path]:
        venv, found = tmp_path / f"venv-{version}", tmp_path / f"torch-{version}"
        made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        assert made.returncode == 0, made.stderr
        stand_in = stand_in_torch(found, version)
        done = run([*PIP, "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--no-deps", str(stand_in)])  # fmt: skip
        assert done.returncode == 0, done.stderr
        return venv, found

    # offline, and blind to the machine's own wheels and pip settings: the only torch pip
    # can find is the stand-in the venv already has
    alone = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    alone["PIP_CONFIG_FILE"] = os.devnull

    def install_with_torch(venv: Path, found: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*PIP, "--python", str(venv / "bin" / "python"), "install", "--no-index",
             "--find-links", str(WHEELHOUSE), "--find-links", str(found), f"{wheel}[torch]"],
            capture_output=True, text=True, timeout=300, check=False, env=alone,
        )  # fmt: skip

    def torch_version(venv: Path) -> str:
        shown = run([*PIP, "--python", str(venv / "bin" / "python"), "show", "torch"])
        return next(line.split()[1] for line in shown.stdout.splitlines()
                    if line.startswith("Version:"))  # fmt: skip

    venv, found = venv_with_torch("2.5.0")
    kept = install_with_torch(venv, found)
    assert kept.returncode == 0, kept.stderr
    assert torch_version(venv) == "2.5.0", "the SDK replaced a torch of its range"

    venv, found = venv_with_torch("2.3.0")
    below = install_with_torch(venv, found)
    assert below.returncode != 0, "a torch below the SDK's range was accepted"
    assert "torch<3,>=2.4" in below.stderr or "torch>=2.4,<3" in below.stderr, below.stderr
