"""A warm spare's wait for its admission (``wait_admitted``) on the file the platform
writes: on Kubernetes a downward-API volume file of the pod's admission annotation, which
the kubelet writes empty while the annotation is unset and then swaps, atomically, for one
with the annotation's value."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from dlrover_events.sdk.identity import ELASTIC_ADMIT_ENV, RANK_ENV
from dlrover_events.sdk.torch.inplace import wait_admitted


def kubelet_writes(folder: Path, text: str, generation: int) -> None:
    """As the kubelet's AtomicWriter does: a new data folder, then one rename of the
    ``..data`` link the file's own link points through."""
    data = folder / f"..{generation}"
    data.mkdir()
    (data / "admission.json").write_text(text)
    link = folder / "..data_tmp"
    link.symlink_to(data.name)
    link.replace(folder / "..data")
    if not (folder / "admission.json").is_symlink():
        (folder / "admission.json").symlink_to("..data/admission.json")


def test_an_empty_admission_file_is_waited_on_until_the_annotation_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "admission.json"
    monkeypatch.setenv(ELASTIC_ADMIT_ENV, str(file))
    monkeypatch.setenv(RANK_ENV, "spare")
    kubelet_writes(tmp_path, "", 1)  # the annotation is not set yet
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(wait_admitted(poll_s=0.02)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not got, "an empty file admitted the spare"
    admission = {"pod": "j-worker-spare-0", "env": {RANK_ENV: "2"}}
    kubelet_writes(tmp_path, json.dumps(admission), 2)
    waiter.join(10)
    assert got == [True]
    assert os.environ[RANK_ENV] == "2" and ELASTIC_ADMIT_ENV not in os.environ
