"""The dlrover-c10d rendezvous's plumbing: one name in the SDK, the operator's launch and
the entry point torchrun loads it by; a restart pod names it where the platform says its
pods have the SDK (the local platform), c10d elsewhere; a rendezvous shut down is not
left again. That a stopped node leaves the round is shown under real torchrun agents
(tests/integration/sdk/test_sdk_elastic_torchrun.py: with plain c10d it fails there)."""

from __future__ import annotations

import multiprocessing
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.torch.rendezvous import BACKEND, LeavingRendezvousHandler
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.bodies import NewPod, Resources
from handlers.operator.reconcile.launch import C10D, DLROVER_C10D, FORK, elastic_command, launch
from tests.unit.operator.reconcile.test_inplace_roles import elastic
from tests.unit.operator.reconcile.test_planning import job

ROOT = Path(__file__).resolve().parents[3]
ENTRY = "dlrover_events.sdk.torch.rendezvous_entry:handler_creator"


def test_one_name_in_the_sdk_the_launch_and_the_entry_point() -> None:
    assert DLROVER_C10D == BACKEND
    assert [e.name for e in entry_points(group="torchrun.handlers")] == [BACKEND]
    # the SDK's distribution declares it, once for both installs (the full one depends on
    # it; its wheel: test_sdk_distribution)
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text("utf-8"))["project"]
    assert sdk["entry-points"]["torchrun.handlers"] == {BACKEND: ENTRY}
    full = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert "torchrun.handlers" not in full["entry-points"]
    assert "dlrover-events-sdk==0.1.0" in full["dependencies"]


def test_a_restart_pod_names_the_platforms_backend() -> None:
    j = job(2, **elastic())
    new = NewPod(role="worker", rank=1, index=1, resources=Resources())
    assert f"--rdzv-backend={C10D}" in (launch(j, new, "prod", "h").command or ())
    local = launch(j, new, "prod", "h", LocalCluster.rendezvous_backend).command or ()
    assert f"--rdzv-backend={BACKEND}" in local


def test_torch_makes_one_from_a_torchrun_flag_and_a_shut_down_one_is_not_left() -> None:
    params = RendezvousParameters(
        backend=BACKEND,
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="unit",
        min_nodes=1,
        max_nodes=1,
        is_host="1",
    )
    handler: Any = registry.create_handler(params)
    assert isinstance(handler, LeavingRendezvousHandler)
    assert handler.get_backend() == BACKEND and handler.get_run_id() == "unit"
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert handler.leave()  # out of the round: its exit operation ran
    assert handler.shutdown()
    assert handler.leave() is False  # shut down: nothing to leave


def test_a_worker_forked_from_the_agent_does_not_leave_in_its_name() -> None:
    """torchrun's --run-path with the fork start method forks the workers from the agent:
    they inherit its handler and its atexit, and ending one must not take the agent's node
    out of the round."""
    params = RendezvousParameters(
        backend=BACKEND,
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="forked",
        min_nodes=1,
        max_nodes=1,
        is_host="1",
    )
    handler: Any = registry.create_handler(params)
    handler.next_rendezvous()
    ctx = multiprocessing.get_context("fork")
    said = ctx.SimpleQueue()
    child = ctx.Process(target=_leave_in_child, args=(handler, said))
    child.start()
    child.join(60)
    assert (child.exitcode, said.get()) == (0, False)
    assert handler.leave()  # the agent itself still leaves
    handler.shutdown()


def _leave_in_child(handler: Any, said: Any) -> None:
    said.put(handler.leave())


def test_a_forked_launch_runs_a_python_script_by_run_path_and_anything_else_as_is() -> None:
    j = job(2, **elastic())
    new = NewPod(role="worker", rank=1, index=1, resources=Resources())
    training = ("python", "examples/elastic/train_elastic.py", "--steps=3")
    role = j.roles["worker"]
    forked = elastic_command(j, role, new, "h", training, DLROVER_C10D, forked=True)
    assert forked[-4:] == ["--run-path", f"--start-method={FORK}", *training[1:]]
    assert "--no-python" not in forked
    plain = elastic_command(j, role, new, "h", training, DLROVER_C10D)
    assert plain[-4:] == ["--no-python", *training]
    other = elastic_command(j, role, new, "h", ("bash", "run.sh"), DLROVER_C10D, forked=True)
    assert other[-3:] == ["--no-python", "bash", "run.sh"]
