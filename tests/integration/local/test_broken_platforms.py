"""The conformance suite fails platforms that break the contract: broken_platforms.py runs
it over local platforms broken on purpose (a delete that leaves the job, a watch that loses
deletions, a change that ignores the version it was decided on) in a pytest session of its
own, and exactly the checks of what each breaks fail there; every other check passes, so
the failures are the breakage's and not the session's."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

BROKEN = Path(__file__).with_name("broken_platforms.py")
#: broken platform -> the checks its breakage fails
CAUGHT = {
    "TestKeepsDeletedJobs": {
        "test_a_deleted_job_is_gone_and_its_pods_can_be_ended",
        "test_a_watch_of_jobs_follows_them",
    },
    "TestLosesDeletions": {
        "test_a_watch_of_jobs_follows_them",
        "test_a_watch_of_pods_follows_them",
    },
    "TestIgnoresVersions": {"test_a_change_on_a_stale_version"},
}


def test_the_suite_fails_platforms_broken_on_purpose(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(BROKEN.relative_to(REPO)),
            "-p",
            "no:cacheprovider",
            "-n",
            "3",
            "-q",
            f"--junitxml={report}",
            f"--basetemp={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), f"the session made no report:\n{run.stdout[-4000:]}{run.stderr}"
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    messages: dict[tuple[str, str], str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        broken = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        verdict = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                verdict = child.tag
                messages[(broken, name)] = child.get("message", "")
        outcomes[broken][name] = verdict

    assert set(outcomes) == set(CAUGHT), outcomes.keys()
    for broken, caught in CAUGHT.items():
        failed = {name for name, verdict in outcomes[broken].items() if verdict == "failure"}
        assert failed == caught, (broken, failed, messages)
        others = {v for name, v in outcomes[broken].items() if name not in caught}
        assert others == {"passed"}, (broken, messages)
    assert run.returncode == 1, run.stdout[-4000:]
    assert (
        "did not show the deletion of job"
        in messages[("TestLosesDeletions", "test_a_watch_of_jobs_follows_them")]
    )
