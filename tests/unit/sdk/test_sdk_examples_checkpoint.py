"""Every example that trains saves and loads its state through the SDK's one way,
``ElasticCheckpoint`` (issue 36, 5): a resume after a suspension, a restart-path resize, a
lost host, an ASHA trial resumed and a warm spare's first state all load through
``restore()``, so an example that wrote its own ``torch.save`` would be a path that does
not. Read from the sources (no example runs but one, twice: the MNIST-like example resumes
from its checkpoint at the step and data position it saved)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"

#: Programs that train without a checkpoint, and why that is right for them.
NO_CHECKPOINT = {
    "examples/multirole/rl.py": (
        "a toy of DI-engine's roles: its learner's policy is the job's output (a JSON the "
        "coordinator reads from the shared volume), not a state a replaced learner resumes"
    ),
}
#: Where torch.save/torch.load are the point: the SDK's own reader of the former format,
#: and the bench that measures torch.save in the loop against ElasticCheckpoint.
RAW_TORCH_IO = {
    "sdk/dlrover_events/sdk/torch/checkpoint.py",
    "sdk/dlrover_events/sdk/torch/checkpoint_bench.py",
}


def programs() -> list[Path]:
    return sorted(EXAMPLES.rglob("*.py"))


def job_scripts() -> list[Path]:
    """The training programs integration tests start (not the tests themselves)."""
    found = (ROOT / "tests" / "integration").rglob("*.py")
    return sorted(p for p in found if not p.name.startswith(("test_", "conftest", "__init__")))


def raw_torch_io(tree: ast.AST) -> list[str]:
    """``torch.save(...)`` and ``torch.load(...)`` calls, also as imported names."""
    calls = []
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "torch":
            imported |= {a.asname or a.name for a in node.names if a.name in ("save", "load")}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("save", "load")
            and isinstance(f.value, ast.Name)
            and f.value.id == "torch"
        ) or (isinstance(f, ast.Name) and f.id in imported):
            calls.append(f"line {node.lineno}: {ast.unparse(f)}")
    return calls


def method_calls(tree: ast.AST) -> set[str]:
    return {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }


def names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def test_the_scan_sees_every_example_and_a_bypass() -> None:
    # the scan would find an example's own torch.save, however it is imported
    bypass = ast.parse("import torch\nfrom torch import load as L\ntorch.save(s, p)\nL(p)\n")
    assert raw_torch_io(bypass) == ["line 3: torch.save", "line 4: L"]
    assert {p.relative_to(ROOT).as_posix() for p in programs()} >= {
        "examples/train_mnist_like.py",
        "examples/elastic/train_elastic.py",
        "examples/experiments/train_trial.py",
        "examples/multirole/rl.py",
    }


@pytest.mark.parametrize("path", programs() + job_scripts(), ids=lambda p: p.name)
def test_no_example_saves_or_loads_torch_state_itself(path: Path) -> None:
    found = raw_torch_io(ast.parse(path.read_text()))
    assert not found, f"{path.relative_to(ROOT)} bypasses ElasticCheckpoint: {found}"


def test_only_the_sdks_own_reader_and_the_bench_call_torch_save_or_load() -> None:
    users = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "sdk").rglob("*.py")
        if raw_torch_io(ast.parse(p.read_text()))
    }
    assert users <= RAW_TORCH_IO, users - RAW_TORCH_IO


@pytest.mark.parametrize("path", programs(), ids=lambda p: p.name)
def test_every_example_that_trains_restores_and_saves_through_elastic_checkpoint(
    path: Path,
) -> None:
    tree = ast.parse(path.read_text())
    calls = method_calls(tree)
    if "backward" not in calls:
        return  # trains nothing
    rel = path.relative_to(ROOT).as_posix()
    if rel in NO_CHECKPOINT:
        assert "ElasticCheckpoint" not in names(tree), f"{rel} checkpoints now: drop it here"
        return
    assert "ElasticCheckpoint" in names(tree), f"{rel} trains without ElasticCheckpoint"
    # restore at the start, save at step boundaries (every N steps, and on SIGTERM)
    assert {"restore", "maybe_save"} <= calls, (rel, sorted(calls & {"restore", "maybe_save"}))


def run_mnist(root: Path, steps: int) -> dict[str, object]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "DLROVER_EVENTS_JOB_ID": "mnist-resume",
        # nothing listens there: the reporter drops its samples, the training goes on
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
    }
    env.pop("DLROVER_EVENTS_CHECKPOINT_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "train_mnist_like.py"),
            f"--steps={steps}",
            "--batch-size=32",
            "--checkpoint-every=10",
            f"--checkpoint={root}",
            "--close-timeout-s=0.5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def test_the_mnist_example_resumes_at_the_step_and_samples_it_saved(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    first = run_mnist(root, 30)
    assert (first["first_step"], first["steps"], first["saved_step"]) == (0, 30, 30)
    second = run_mnist(root, 50)
    # from the checkpoint: 20 more steps, not 50 from the start
    assert (second["first_step"], second["steps"], second["saved_step"]) == (30, 50, 50)
    manifest = json.loads((root / "step-000000000050" / "manifest.json").read_text())
    assert manifest["step"] == 50
    # the sampler's position travelled with it: 50 batches of 32 consumed, not 20
    from dlrover_events.sdk.torch import ElasticSampler

    probe = ElasticSampler(4096, 32, seed=0)
    progress = read_progress(root / "step-000000000050")
    probe.load_state_dict(progress["sampler"])
    assert probe.position == 50 * 32


def read_progress(directory: Path) -> dict[str, Any]:
    """The progress rank 0 saved (step, knobs, sampler), read back through DCP."""
    import torch.distributed.checkpoint as dcp

    state: dict[str, object] = {"progress": ""}
    dcp.load(state, checkpoint_id=str(directory))
    progress: dict[str, Any] = json.loads(str(state["progress"]))
    return progress
