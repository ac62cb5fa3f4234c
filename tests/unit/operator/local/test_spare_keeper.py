"""The local platform's spare keeper, on disk and with real processes (a `sleep` stands
for a spare's shim): how many spares a role keeps, how a pod takes one, and that a spare
that ended on its own is not started again at once."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dlrover_events.pods import shim
from handlers.operator.local import spares
from handlers.operator.local.spare_keeper import SpareKeeper
from handlers.operator.local.store import read_json, write_json
from handlers.operator.platform.bodies import RUNNING, PodView, Resources
from tests.unit.operator.local.test_spares import in_place, pod_spec

UID = "uid-1"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def keeper_of(root: Path, started: list[subprocess.Popen[bytes]]) -> SpareKeeper:
    pods_dir = root / "pods"
    pods_dir.mkdir(parents=True)

    def start(name: str, node_dir: Path) -> None:
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        created = psutil.Process(proc.pid).create_time()
        write_json(node_dir / shim.PID, {"pid": proc.pid, "create_time": created})

    return SpareKeeper(root, pods_dir, start)


def a_pod(keeper_root: Path, name: str = "j-worker-0") -> dict[str, PodView]:
    """A running pod of the role, whose shim spec its spares are made of."""
    pod_dir = keeper_root / "pods" / name
    pod_dir.mkdir()
    write_json(pod_dir / shim.SPEC, pod_spec())
    view = PodView(name, "p", "j", UID, "worker", 0, 0, RUNNING, False, Resources())
    return {name: view}


def running(keeper: SpareKeeper) -> list[str]:
    return sorted(n for n, (_, alive) in keeper.every().items() if alive)


async def until_ended(keeper: SpareKeeper, count: int) -> None:
    for _ in range(500):
        if len(running(keeper)) == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still running: {running(keeper)}")


@pytest.mark.asyncio
async def test_a_role_keeps_as_many_spares_as_it_asks(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    keeper = keeper_of(tmp_path, started)
    pods = a_pod(tmp_path)
    keeper.keep([in_place(2)], pods)
    assert len(running(keeper)) == 1  # one started a scan
    keeper.keep([in_place(2)], pods)
    assert len(running(keeper)) == 2 and len(started) == 2
    keeper.keep([in_place(2)], pods)
    assert len(started) == 2  # kept, none more
    keeper.keep([in_place(1)], pods)  # one too many: asked to end
    await until_ended(keeper, 1)
    keeper.keep([in_place(1)], pods)
    assert len(list(keeper.dir.iterdir())) == 1 and len(started) == 2
    keeper.keep([in_place(1, phase="Succeeded")], pods)  # the job ended: none
    await until_ended(keeper, 0)
    keeper.keep([in_place(1, phase="Succeeded")], pods)
    assert not list(keeper.dir.iterdir())


@pytest.mark.asyncio
async def test_a_new_pod_takes_a_spare_then_the_role_gets_another(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    keeper = keeper_of(tmp_path, started)
    pods = a_pod(tmp_path)
    keeper.keep([in_place(1)], pods)
    [spare] = running(keeper)
    pod_dir = tmp_path / "pods" / "j-worker-1"
    pod_dir.mkdir()
    record = {"name": "j-worker-1", "job_uid": UID, "role": "worker"}
    other = {**record, "job_uid": "uid-2"}
    assert not keeper.admit("j-worker-1", other, pod_spec())  # never across jobs
    assert keeper.admit("j-worker-1", record, pod_spec())
    assert read_json(pod_dir / shim.POD) == record
    assert read_json(pod_dir / spares.SPARE) is not None  # the spare's directory, moved
    admitted = read_json(keeper.admission_file(spare))
    assert admitted is not None and admitted["pod"] == "j-worker-1"
    assert running(keeper) == []
    keeper.keep([in_place(1)], pods)
    assert len(running(keeper)) == 1 and len(started) == 2
    keeper.forget_admission(pod_dir)  # the pod goes: its admission with it
    assert not keeper.admission_file(spare).exists()


@pytest.mark.asyncio
async def test_a_spare_that_ended_on_its_own_is_not_started_again_at_once(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    keeper = keeper_of(tmp_path, started)
    pods = a_pod(tmp_path)
    keeper.keep([in_place(1)], pods)
    started[0].kill()
    started[0].wait()
    keeper.keep([in_place(1)], pods)  # removed, and held back for the backoff
    assert not list(keeper.dir.iterdir()) and len(started) == 1


@pytest.mark.asyncio
async def test_end_all_then_remove_leaves_no_spare(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    keeper = keeper_of(tmp_path, started)
    pods = a_pod(tmp_path)
    keeper.keep([in_place(2)], pods)
    keeper.keep([in_place(2)], pods)
    names = keeper.end_all()
    assert len(names) == 2
    await until_ended(keeper, 0)
    assert not keeper.any_running()
    keeper.remove(names)
    assert not list(keeper.dir.iterdir())
