"""The save's copy behind training (issue 36): what a forward pass changes is copied in the
step, the parameters and the optimizer's state behind the next forward and backward, and
the optimizer's next step waits for that copy, so the checkpoint is the state as of the save.

The gated tests hold the copy behind training until the checkpoint's ``wait_staged`` waits
(what the optimizer's step pre-hook calls) or, failing that, until the optimizer's
step has finished: without the wait the copy would then take the updated parameters, and
the test sees them in the checkpoint. No timing decides anything."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlrover_events.sdk.torch import ElasticCheckpoint

GATE_S = 120.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 256)  # 256 KiB weights: copied behind training
        self.norm = nn.BatchNorm1d(256)  # running statistics: changed by a forward pass
        self.b = nn.Linear(256, 256)
        self.frozen = nn.Linear(256, 256)  # held by no optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.norm(self.a(x)))) + self.frozen(x).detach()


def build(seed: int) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net()
    trained = [p for n, p in model.named_parameters() if not n.startswith("frozen.")]
    return model, torch.optim.Adam(trained, lr=0.05)


def train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(16, 256)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in opt.state.items():
        for k, v in state.items():
            out[f"optim.{names[id(p)]}.{k}"] = v.detach().clone()
    return out


def saved(root: Path) -> dict[str, torch.Tensor]:
    """What the newest checkpoint under ``root`` restores into a fresh model."""
    model, opt = build(99)
    ElasticCheckpoint(root, model, opt, handle_sigterm=False).restore()
    return snapshot(model, opt)


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return sorted(k for k in a if not torch.equal(a[k], b[k]))


class Gated(ElasticCheckpoint):
    """The copy behind training waits for ``gate``; ``wait_staged`` opens it once it has
    marked the save as waited for (so the copy cannot end before the wait begins)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.waits = 0

    def _copy_behind(self, persist: Any) -> None:
        assert self.gate.wait(GATE_S), "the gate was never opened"
        super()._copy_behind(persist)

    def _wait_copies(self, pending: list[Any], deadline: float | None) -> bool:
        self.waits += 1
        self.gate.set()
        return super()._wait_copies(pending, deadline)


def test_an_update_right_after_save_does_not_reach_the_checkpoint(tmp_path: Path) -> None:
    model, opt = build(0)
    for _ in range(2):
        train(model, opt)
    ck = ElasticCheckpoint(tmp_path / "job", model, opt, handle_sigterm=False)
    before = snapshot(model, opt)
    assert ck.save(2, wait=False)
    assert ck.last_behind_bytes >= 4 * 256 * 256 * 4  # a's, b's weights and their moments
    train(model, opt)  # a forward (running statistics), a backward, the optimizer's step
    assert ck.wait(60)
    changed = differing(before, snapshot(model, opt))
    assert "model.a.weight" in changed and "model.norm.running_mean" in changed
    assert "optim.a.weight.exp_avg" in changed
    assert differing(before, saved(tmp_path / "job")) == []


def test_the_optimizers_step_waits_for_the_copy(tmp_path: Path) -> None:
    model, opt = build(0)
    train(model, opt)
    ck = Gated(tmp_path / "job", model, opt, handle_sigterm=False)
    # were the step not to wait, the copy would start once the step has changed the state
    opt.register_step_post_hook(lambda *_: ck.gate.set())
    before = snapshot(model, opt)
    assert ck.save(1, wait=False)
    train(model, opt)
    assert ck.waits == 1 and ck.wait(60)
    assert "model.a.weight" in differing(before, snapshot(model, opt))
    assert differing(before, saved(tmp_path / "job")) == []
    # the wait is blocking time: in the step's figure and in the manifest's
    wait, blocking = ck.last_staging_wait_s, ck.last_blocking_s
    assert wait is not None and blocking is not None and wait > 0
    (manifest,) = ck.committed()
    assert manifest.blocking_s > round(blocking - wait, 6)


def test_what_a_forward_or_the_job_may_change_is_copied_in_the_step(tmp_path: Path) -> None:
    model, opt = build(0)
    train(model, opt)
    ck = Gated(tmp_path / "job", model, opt, handle_sigterm=False)
    before = snapshot(model, opt)
    assert ck.save(1, wait=False)
    model(torch.randn(16, 256))  # training mode: BatchNorm's running statistics move
    with torch.no_grad():
        model.frozen.weight.add_(1.0)  # a parameter no optimizer holds
        model.a.weight.add_(1.0)  # one the optimizer holds, changed without wait_staged
    ck.gate.set()
    assert ck.wait(60) and ck.waits == 0
    leaked = differing(before, saved(tmp_path / "job"))
    # buffers and parameters outside the optimizer were taken in the step; a change of an
    # optimizer's parameter that did not wait reaches the checkpoint: the documented rule
    assert leaked == ["model.a.weight"]


def test_wait_staged_lets_the_job_change_parameters_itself(tmp_path: Path) -> None:
    model, opt = build(0)
    train(model, opt)
    ck = Gated(tmp_path / "job", model, opt, handle_sigterm=False)
    before = snapshot(model, opt)
    assert ck.save(1, wait=False)
    assert ck.wait_staged(60)
    with torch.no_grad():
        model.a.weight.mul_(0.5)
    assert ck.wait(60)
    assert differing(before, saved(tmp_path / "job")) == []
    assert ck.wait_staged(0)  # nothing left to copy: returns at once


def test_without_an_optimizer_everything_is_copied_in_the_step(tmp_path: Path) -> None:
    model, _ = build(0)
    ck = Gated(tmp_path / "job", model, handle_sigterm=False)
    assert ck.save(1, wait=False) and ck.last_behind_bytes == 0
    assert ck.wait(60)
