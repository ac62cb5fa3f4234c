"""Elastic training pieces: the checkpoint (atomic, on SIGTERM, on a lost peer, shared by
the rank that holds it), peer failures told from other errors, and who a process is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.identity import JOB_ID_ENV, RANK_ENV, JobIdentity
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.torch import ElasticCheckpoint, is_peer_failure
from dlrover_events.settings import Settings

REPO = Path(__file__).resolve().parents[3]


def model_and_optimizer(seed: int = 0) -> tuple[nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_saves_every_n_steps_and_resumes_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "ck" / "job.pt"
    model, opt = model_and_optimizer()
    knobs = StepKnobs(8, 2)
    ck = ElasticCheckpoint(path, model, opt, every=3, knobs=knobs, handle_sigterm=False)
    saved = []
    for step in range(1, 8):
        train(model, opt)
        saved.append(ck.maybe_save(step))
        assert ck.wait(30)  # persisted behind the step: committed before the next one
    assert saved == [False, False, True, False, False, True, False]
    assert ck.saved_step == 6 and ck.saves == 2
    assert [p.name for p in path.parent.iterdir()] == ["job.pt"]  # no temporary left

    fresh, fresh_opt = model_and_optimizer(seed=1)
    fresh_knobs = StepKnobs(32)
    again = ElasticCheckpoint(path, fresh, fresh_opt, knobs=fresh_knobs, handle_sigterm=False)
    assert again.restore() == 6  # the step goes on, not from 0
    assert fresh_knobs.knobs == knobs.knobs
    assert fresh_opt.state_dict()["state"]  # momentum buffers came back
    assert again.maybe_save(7) is False  # not due: 7 - 6 < every


def test_no_file_or_a_bad_file_starts_from_zero(tmp_path: Path) -> None:
    model, opt = model_and_optimizer()
    assert ElasticCheckpoint(tmp_path / "none.pt", model, opt, handle_sigterm=False).restore() == 0
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert ElasticCheckpoint(bad, model, opt, handle_sigterm=False).restore() == 0


def test_a_failed_write_keeps_the_old_file_and_does_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "job.pt"
    model, opt = model_and_optimizer()
    ck = ElasticCheckpoint(path, model, opt, every=1, handle_sigterm=False)
    assert ck.save(1)
    before = sorted(p.name for p in path.rglob("*"))
    ck.model = None  # type: ignore[assignment]  # state_dict() of None fails mid-save
    assert not ck.save(2)
    assert sorted(p.name for p in path.rglob("*")) == before and ck.saved_step == 1
    assert [m.step for m in ck.committed()] == [1]
    assert not list(tmp_path.rglob(".*.tmp"))


def test_sigterm_stops_at_the_next_boundary_with_a_save(tmp_path: Path) -> None:
    model, opt = model_and_optimizer()
    ck = ElasticCheckpoint(tmp_path / "job.pt", model, opt, every=1000)
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the agent restarting its workers
        assert ck.should_stop
        assert ck.maybe_save(17)  # not due by steps, saved because stopping
        assert ck.saved_step == 17
    finally:
        ck.uninstall_sigterm_handler()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_lost_peer_saves_the_last_completed_step(tmp_path: Path) -> None:
    model, opt = model_and_optimizer()
    ck = ElasticCheckpoint(tmp_path / "job.pt", model, opt, every=1000, handle_sigterm=False)
    ck.maybe_save(41)
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    with pytest.raises(RuntimeError), ck.on_peer_failure():
        raise lost
    assert ck.saved_step == 41
    with pytest.raises(RuntimeError), ck.on_peer_failure():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    assert ck.saves == 1


def test_peer_failures_told_apart() -> None:
    assert is_peer_failure(RuntimeError("Connection closed by peer [127.0.0.1]:31428"))
    assert is_peer_failure(torch.distributed.DistBackendError("NCCL error"))
    assert not is_peer_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_peer_failure(ValueError("gloo"))


WORKER = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from torch import nn
    from dlrover_events.sdk.torch import ElasticCheckpoint
    rank, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(100 + rank)
    model = nn.Linear(4, 2)
    ck = ElasticCheckpoint(path, model, handle_sigterm=False)
    step = ck.restore()
    print(step, float(model.weight.sum()), flush=True)
    dist.destroy_process_group()
    """
)


def format_1_file(path: Path, model: nn.Module, step: int) -> None:
    """A checkpoint as rank 0 wrote it before the manifest's layout: one torch.save file."""
    state = {"format": 1, "step": step, "world_size": 2, "model": model.state_dict()}
    torch.save({**state, "optimizer": None, "knobs": None}, path)


def test_the_rank_holding_the_newest_file_sends_it_to_all(tmp_path: Path) -> None:
    # Format 1 (one file on each node's own disk), still read: rank 1 has the file (it was
    # rank 0 before the re-rendezvous), rank 0 an older one.
    model, _ = model_and_optimizer()
    format_1_file(tmp_path / "r1.pt", model, 30)
    format_1_file(tmp_path / "r0.pt", nn.Linear(4, 2), 10)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(port), str(tmp_path / f"r{r}.pt")],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    assert outs[0][0] == "30" and float(outs[0][1]) == pytest.approx(
        float(model.weight.detach().sum())
    )


def test_the_node_id_stays_while_the_torch_world_changes() -> None:
    env = {JOB_ID_ENV: "j", RANK_ENV: "2", "RANK": "0", "WORLD_SIZE": "3"}
    ident = JobIdentity.from_env(env)
    assert (ident.rank, ident.process_rank, ident.world_size) == (2, 0, 3)
    after = JobIdentity.from_env({**env, "RANK": "1", "WORLD_SIZE": "2"})  # re-rendezvous
    assert (after.rank, after.process_rank, after.world_size) == (2, 1, 2)
    # The launcher's world wins over the operator's replica count.
    both = JobIdentity.from_env({**env, "DLROVER_EVENTS_WORLD_SIZE": "4"})
    assert both.world_size == 3


def test_samples_carry_the_world_size_and_the_knobs_in_force() -> None:
    ident = JobIdentity(job=JobIdentity.from_env({JOB_ID_ENV: "j"}).job, world_size=3)
    reporter = Reporter(
        ident,
        settings=Settings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        local_batch_size=8,
        accumulation_steps=2,
    )
    for _ in range(3):
        reporter.step()
    reporter.set_training(4, 4)
    reporter._drain_steps()
    sample = reporter._cut_sample()
    assert sample is not None
    assert (sample.world_size, sample.local_batch_size, sample.accumulation_steps) == (3, 4, 4)
