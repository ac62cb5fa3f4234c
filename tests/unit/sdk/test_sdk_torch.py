"""The torch hook: OOMs recognised, reported with their numbers, and re-raised unchanged.

Requires torch (the `torch` extra, installed by `make test`): an ImportError here is a
broken test environment, not a reason to skip.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.torch import (
    CudaProbe,
    TorchHook,
    batch_samples,
    oom_kind,
    requested_bytes,
)
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta, OOMKind


@pytest.fixture
def hook() -> Iterator[TorchHook]:
    reporter = Reporter(
        JobIdentity(job=JobMeta(uuid="job-torch"), env="unit"),
        settings=Settings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        interval_s=0.05,
        send_timeout_s=0.3,
        retry_backoff_max_s=0.05,
    )
    h = TorchHook(reporter, flush_timeout_s=0.3).start()
    yield h
    h.close(timeout_s=0.1)


def test_oom_kinds() -> None:
    assert oom_kind(torch.cuda.OutOfMemoryError("CUDA out of memory.")) == OOMKind.GPU_MEMORY
    assert oom_kind(MemoryError()) == OOMKind.HOST_MEMORY
    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
    assert oom_kind(cpu) == OOMKind.HOST_MEMORY
    assert oom_kind(RuntimeError("shape mismatch")) is None
    assert oom_kind(ValueError("x")) is None


def test_requested_bytes_from_torchs_messages() -> None:
    gpu = "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)"
    assert requested_bytes(RuntimeError(gpu)) == 20 * 2**20
    cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes."
    assert requested_bytes(RuntimeError(cpu)) == 4096
    assert requested_bytes(RuntimeError("other")) == 0


def test_batch_samples() -> None:
    x, y = torch.zeros(12, 3), torch.zeros(12)
    assert batch_samples(x) == 12
    assert batch_samples((x, y)) == 12
    assert batch_samples({"input": x}) == 12
    assert batch_samples(torch.tensor(1.0)) is None
    assert batch_samples("text") is None


def test_a_real_cpu_allocation_failure_is_reported_and_reraised(
    hook: TorchHook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dlrover_events.sdk")
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator") as raised, hook.guard():
        torch.empty(2**62, dtype=torch.uint8)  # far more than any host has
    assert oom_kind(raised.value) == OOMKind.HOST_MEMORY
    stats = hook.reporter.stats()
    assert stats.queued == 1  # the OOM event, waiting for a broker that is not there
    assert any("OOM event may not have reached" in r.getMessage() for r in caplog.records)
    final = hook.close(timeout_s=0.1)
    assert final.dropped == final.queued


def test_gpu_oom_and_memory_error_propagate_unchanged(hook: TorchHook) -> None:
    gpu = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.cuda.OutOfMemoryError) as raised, hook.guard():
        raise gpu
    assert raised.value is gpu
    with pytest.raises(MemoryError), hook.guard():
        raise MemoryError
    assert hook.reporter.stats().queued == 2


def test_other_errors_are_not_ooms(hook: TorchHook) -> None:
    with pytest.raises(RuntimeError, match="mismatch"), hook.guard():
        raise RuntimeError("shape mismatch")
    assert hook.reporter.stats().queued == 0


def test_watch_marks_a_step_per_call_and_guards_it(hook: TorchHook) -> None:
    model = torch.nn.Linear(4, 2)

    @hook.watch
    def train_step(x: torch.Tensor) -> float:
        return float(model(x).sum().detach())

    for _ in range(5):
        train_step(torch.ones(3, 4))
    assert hook.reporter.stats().steps == 5


def test_track_counts_samples_from_the_batches(hook: TorchHook) -> None:
    batches = [(torch.zeros(16, 4), torch.zeros(16)) for _ in range(4)]
    assert len(list(hook.track(batches))) == 4
    assert hook.reporter.stats().steps == 4


def test_nested_guards_report_one_oom_once(hook: TorchHook) -> None:
    @hook.watch
    def train_step() -> None:
        raise MemoryError

    with pytest.raises(MemoryError), hook.guard():
        train_step()
    assert hook.reporter.stats().queued == 1


def test_cuda_probe_reads_nothing_until_training_initialised_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A probe must never be what creates a CUDA context (in the wrong thread, on the wrong
    # device): with CUDA present but not initialised yet, it reads nothing.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert CudaProbe()() == {}
