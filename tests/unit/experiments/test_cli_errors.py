"""`experiment create` refuses a bad file in one line naming the field, with no traceback,
before it reaches a broker or a database (none is configured here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.unit.experiments.documents import document

MAIN = [sys.executable, "-c", "from dlrover_events.cli.app import main; main()"]


def create(tmp_path: Path, content: str | bytes) -> tuple[int, str]:
    path = tmp_path / "experiment.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    done = subprocess.run(
        [*MAIN, "experiment", "create", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        # nothing to reach: a command that got past the checks would fail otherwise
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("DLROVER_EVENTS_")},
            "DLROVER_EVENTS_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "DLROVER_EVENTS_PG_DSN": "postgresql://nobody@127.0.0.1:1/none",
        },
        check=False,
    )
    return done.returncode, done.stderr


def as_yaml(doc: dict[str, Any]) -> str:
    return str(yaml.safe_dump(doc))


def wrong_type() -> dict[str, Any]:
    doc = document()
    doc["spec"]["hyperparameters"]["width"]["maxval"] = "wide"
    return doc


def grid_without_counts() -> dict[str, Any]:
    doc = document(name="grid")
    del doc["spec"]["hyperparameters"]["lr"]["count"]
    return doc


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (as_yaml(document(metirc="loss")), "spec.searcher.metirc: unknown field"),
        (as_yaml(wrong_type()), "spec.hyperparameters.width.maxval: Input should be a valid"),
        (as_yaml(document(name="nope")), "spec.searcher.name: unknown searcher 'nope'; known:"),
        (as_yaml(grid_without_counts()), "spec.hyperparameters.lr"),
        ("metadata: {name: [x\n", "not YAML: line 2:"),
        ("- 1\n- 2\n", "an experiment is a mapping"),
        (b"\xff\xfe", "cannot read it"),
    ],
    ids=["unknown field", "wrong type", "unknown searcher", "searcher's check", "yaml", "list",
         "bytes"],
)  # fmt: skip
def test_a_bad_file_is_one_line_naming_the_field(
    tmp_path: Path, content: str | bytes, said: str
) -> None:
    code, stderr = create(tmp_path, content)
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"error: {tmp_path / 'experiment.yaml'}: "), lines
    assert said in lines[0], lines


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*MAIN, "experiment", "create", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "does not exist" in lines[0], lines


def test_a_valid_file_gets_past_the_checks(tmp_path: Path) -> None:
    """The same command with a good file goes on to the env (none answers here): the
    refusals above are the file's."""
    code, stderr = create(tmp_path, as_yaml(document()))
    assert code == 2 and "cannot reach Postgres" in stderr, stderr
