"""The checkpoint's commit (issue 36): a manifest written last decides what is whole, a torn
one is refused in one line, a directory without one is passed over; what a checkpoint
carries besides the model (the data's position, the RNG, the knobs); a persist that fails
is retried behind training; the catalog's event of a commit."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from dlrover_events.backoff import Backoff
from dlrover_events.sdk.checkpoint_manifest import (
    MANIFEST,
    CheckpointError,
    Manifest,
    SaveReason,
    checkpoint_id,
    committed_event,
    missing_parts,
    newest_first,
    parse_manifest,
    refuse_parts,
    step_dir,
    step_of,
)
from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.torch import ElasticCheckpoint, ElasticSampler, list_checkpoints
from schemas.checkpoints import CheckpointCommitted, CheckpointReason
from schemas.jobs import JobMeta


def manifest(**over: object) -> Manifest:
    fields: dict[str, object] = {
        "checkpoint_id": "job-7-ab",
        "job": "job",
        "step": 7,
        "world_size": 4,
        "saved_at": 1.0,
        "blocking_s": 0.01,
        "persist_s": 0.5,
        "files": {"__0_0.distcp": 100, ".metadata": 20},
    }
    return Manifest.model_validate({**fields, **over})


# -- the pure parts ------------------------------------------------------------------------


def test_step_directories_sort_by_step_and_others_are_not_checkpoints() -> None:
    assert step_dir(7) == "step-000000000007"
    assert step_of("s3://b/job/step-000000000007/") == 7
    assert step_of("step-7") is None and step_of("notes.txt") is None
    names = [step_dir(10), "tmp", step_dir(9), step_dir(100)]
    assert [s for s, _ in newest_first(names)] == [100, 10, 9]
    with pytest.raises(ValueError, match=">= 0"):
        step_dir(-1)


def test_a_manifest_round_trips_and_a_torn_one_is_refused_in_one_line() -> None:
    m = manifest()
    assert parse_manifest(m.model_dump_json(), "x") == m
    assert m.size_bytes == 120
    torn = m.model_dump_json()[:40]
    with pytest.raises(CheckpointError) as err:
        parse_manifest(torn, "/ck/job/step-000000000007")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("checkpoint /ck/job/step-000000000007 refused: its manifest.json")
    assert "torn" in text and "remove that directory" in text
    with pytest.raises(CheckpointError, match="invalid"):
        parse_manifest(m.model_dump_json().replace('"step":7', '"step":-1'), "x")
    with pytest.raises(CheckpointError, match="invalid"):
        parse_manifest("{}", "x")  # JSON, but no manifest


def test_a_part_missing_or_short_is_refused() -> None:
    m = manifest()
    assert missing_parts(m, {"__0_0.distcp": 100, ".metadata": 25}) == []
    assert missing_parts(m, {"__0_0.distcp": 99}) == [
        ".metadata missing",
        "__0_0.distcp has 99 bytes of 100",
    ]
    with pytest.raises(CheckpointError, match=r"\.metadata missing and 1 more"):
        refuse_parts(m, {"__0_0.distcp": 99}, "x")


def test_checkpoint_ids_are_what_the_catalog_accepts() -> None:
    cid = checkpoint_id("my job/ä", 12, "ff")
    assert cid == "my_job-12-ff"
    assert checkpoint_id("job", 1) != checkpoint_id("job", 1)  # two runs of a step


def test_the_commit_is_the_catalogs_event() -> None:
    ident = JobIdentity(job=JobMeta(uuid="job-1"), env="t")
    event = committed_event(manifest(reason="sigterm"), "s3://b/job-1/step-7", ident, "exp", 3)
    assert isinstance(event, CheckpointCommitted)
    assert (event.step, event.world_size, event.size_bytes) == (7, 4, 120)
    assert (event.experiment, event.trial, event.key) == ("exp", 3, "job-1")
    assert event.reason is CheckpointReason.SIGTERM and event.url == "s3://b/job-1/step-7"


# -- one process, real files ---------------------------------------------------------------


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(5, 6)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def test_the_data_position_the_rng_and_the_knobs_travel_with_it(tmp_path: Path) -> None:
    model, opt = build(0)
    sampler = ElasticSampler(100, 10, seed=3)
    knobs = StepKnobs(8, 2)
    ck = ElasticCheckpoint(
        tmp_path / "job", model, opt, every=4, sampler=sampler, knobs=knobs, handle_sigterm=False
    )
    for _ in range(4):
        step(model, opt)
        sampler.advance()
    random.seed(11)
    torch.manual_seed(12)
    assert ck.save(4)
    expected = (random.random(), float(torch.rand(1)), sampler.local_batch())

    fresh, fresh_opt = build(1)
    fresh_sampler = ElasticSampler(100, 10, seed=3)
    fresh_knobs = StepKnobs(32)
    again = ElasticCheckpoint(
        tmp_path / "job",
        fresh,
        fresh_opt,
        sampler=fresh_sampler,
        knobs=fresh_knobs,
        handle_sigterm=False,
    )
    assert again.restore() == 4
    assert (random.random(), float(torch.rand(1)), fresh_sampler.local_batch()) == expected
    assert fresh_sampler.position == 40 and fresh_knobs.knobs == knobs.knobs
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].abs().sum() > 0
    assert again.restored_world_size == 1


def test_a_persist_that_never_finished_is_passed_over(tmp_path: Path) -> None:
    model, opt = build(0)
    ck = ElasticCheckpoint(tmp_path / "job", model, opt, handle_sigterm=False)
    assert ck.save(5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    step(model, opt)
    assert ck.save(9)
    (tmp_path / "job" / step_dir(9) / MANIFEST).unlink()  # killed before the commit
    fresh, fresh_opt = build(1)
    again = ElasticCheckpoint(tmp_path / "job", fresh, fresh_opt, handle_sigterm=False)
    assert again.restore() == 5
    assert all(torch.equal(state[k], v) for k, v in fresh.state_dict().items())
    assert [m.step for m in list_checkpoints(tmp_path / "job")] == [5]


def test_a_torn_manifest_is_refused_not_loaded_half(tmp_path: Path) -> None:
    model, opt = build(0)
    ck = ElasticCheckpoint(tmp_path / "job", model, opt, handle_sigterm=False)
    assert ck.save(5)
    assert ck.save(9)
    path = tmp_path / "job" / step_dir(9) / MANIFEST
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"step-000000000009 refused: .* torn"):
        ElasticCheckpoint(tmp_path / "job", *build(1), handle_sigterm=False).restore()
    # a part gone from a committed checkpoint: refused too
    path.unlink()
    (part,) = (tmp_path / "job" / step_dir(5)).glob("__0_*.distcp")
    part.unlink()
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp missing"):
        ElasticCheckpoint(tmp_path / "job", *build(1), handle_sigterm=False).restore()


def test_a_failed_persist_is_retried_behind_training_and_committed(tmp_path: Path) -> None:
    model, opt = build(0)
    commits: list[int] = []
    ck = ElasticCheckpoint(
        tmp_path / "job",
        model,
        opt,
        every=2,
        handle_sigterm=False,
        backoff=Backoff(initial_s=0.05, max_s=0.2),
        on_commit=lambda m, url: commits.append(m.step),
    )
    (tmp_path / "job").mkdir()
    blocker = tmp_path / "job" / step_dir(2)
    blocker.write_text("a file where the step's directory goes: the write fails")
    step(model, opt)
    assert ck.maybe_save(1) is False
    step(model, opt)
    assert ck.maybe_save(2) is True  # started: the step does not wait for storage
    deadline = time.monotonic() + 20
    while ck.persist_failures < 2:
        assert time.monotonic() < deadline, "the persist was not retried"
        time.sleep(0.02)
    step(model, opt)
    step(model, opt)
    assert ck.maybe_save(4) is False and ck.put_off == 1  # one in flight: put off
    blocker.unlink()  # storage is back
    assert ck.wait(20)
    assert commits == [2] and ck.saved_step == 2 and ck.given_up == 0
    assert ck.maybe_save(4) is True and ck.wait(20)
    assert commits == [2, 4]


def test_a_save_started_on_another_thread_blocks_only_for_the_copy(tmp_path: Path) -> None:
    # The persist's thread is not a daemon: an ending interpreter waits for the commit.
    model, opt = build(0)
    ck = ElasticCheckpoint(tmp_path / "job", model, opt, handle_sigterm=False)
    assert ck.save(3, wait=False, reason=SaveReason.PERIODIC)
    threads = [t for t in threading.enumerate() if t.name == "checkpoint-3"]
    assert all(not t.daemon for t in threads)
    assert ck.wait(30) and ck.last_blocking_s is not None
    (m,) = ck.committed()
    assert m.reason is SaveReason.PERIODIC and m.blocking_s == pytest.approx(
        ck.last_blocking_s, abs=1e-5
    )
