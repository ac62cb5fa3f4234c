"""The A/B results the console shows: the ``summary.json`` files `ab run` writes in its
``--out`` folder (docs/virtual-envs.md, "Machine-readable verdict"), read from the folders
the console is told (DLROVER_EVENTS_CONSOLE_AB_REPORTS: each a run's folder, or a folder of
runs' folders).

A file that is not a summary says why on the page instead of breaking it; a summary's
per-job JCTs are left out (a run of thousands of jobs would make the page heavy), their
count kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
#: The summary shape this reader knows (keys are only added within a version).
SCHEMA_VERSION = 1
#: A summary larger than this is not read (it would not be one `ab run` wrote).
MAX_BYTES = 8 * 2**20
#: Runs shown, the newest first.
MAX_RUNS = 20
ARM_KEYS = (
    "name",
    "env",
    "settings",
    "mean_jct_s",
    "jct_ci95_s",
    "paired_diff_s",
    "paired_diff_ci95_s",
    "paired_jobs",
    "verdict",
    "gpu_hours",
    "plans_per_job_hour",
    "jobs_finished",
    "jobs_unfinished",
    "jobs_failed",
    "metrics",
)


def summary_files(folders: Sequence[Path]) -> list[Path]:
    """Each folder's summary.json and its sub-folders' ones, the newest first."""
    found: set[Path] = set()
    for folder in folders:
        if (folder / SUMMARY_FILE).is_file():
            found.add(folder / SUMMARY_FILE)
        if folder.is_dir():
            found.update(p for p in folder.glob(f"*/{SUMMARY_FILE}") if p.is_file())

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=mtime, reverse=True)[:MAX_RUNS]


def read_run(path: Path) -> dict[str, Any]:
    """One run as the page shows it, or ``{"path", "error"}`` saying why it cannot be."""
    try:
        if path.stat().st_size > MAX_BYTES:
            return {"path": str(path), "error": f"larger than {MAX_BYTES // 2**20} MiB"}
        return {"path": str(path), **run_view(json.loads(path.read_bytes()))}
    except OSError as e:
        return {"path": str(path), "error": f"cannot read it: {e.strerror or e}"}
    except ValueError as e:
        return {"path": str(path), "error": f"not JSON: {e}"}
    except SummaryError as e:
        return {"path": str(path), "error": str(e)}


class SummaryError(ValueError):
    """A JSON file that is not an A/B summary this console knows."""


def run_view(doc: Any) -> dict[str, Any]:
    """What the page needs of a summary: the run and its arms, per-job JCTs counted."""
    if not isinstance(doc, dict):
        raise SummaryError("not an A/B summary (a JSON object is expected)")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SummaryError(
            f"schema_version {version!r}: this console reads version {SCHEMA_VERSION}"
        )
    arms = doc.get("arms")
    if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
        raise SummaryError("no list of arms")
    return {
        "run_id": doc.get("run_id"),
        "trace": doc.get("trace"),
        "source": doc.get("source"),
        "baseline": doc.get("baseline"),
        "speed": doc.get("speed"),
        "cluster": doc.get("cluster"),
        "wall_s": doc.get("wall_s"),
        "verdicts": [v for v in doc.get("verdicts") or [] if isinstance(v, str)],
        "arms": [
            {
                **{k: a.get(k) for k in ARM_KEYS},
                "jobs": len(a["jobs"]) if isinstance(a.get("jobs"), dict) else 0,
            }
            for a in arms
        ],
    }


def ab_runs(folders: Sequence[Path]) -> dict[str, Any]:
    """Where the console looked (resolved: a relative folder is the console's), and the
    runs found there (blocking file I/O: run it in a thread)."""
    return {
        "folders": [str(f.resolve()) for f in folders],
        "runs": [read_run(p) for p in summary_files(folders)],
    }


__all__ = ["SummaryError", "ab_runs", "read_run", "run_view", "summary_files"]
