"""The local platform's hand-over at a promotion: the new real env's folder becomes the
machine's jobs folder (a link to the old real env's), made once; an env with jobs of its
own keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers.operator.local.handover import Facts, Own, Step, facts_of, hand_over, step


@pytest.mark.parametrize(
    ("facts", "todo"),
    [
        (Facts(Own.ABSENT, None, False, False), Step.KEEP),  # no promotion yet
        (Facts(Own.ABSENT, "prod", True, False), Step.LINK),
        (Facts(Own.ABSENT, "prod", False, False), Step.KEEP),  # nothing to take over
        (Facts(Own.LINK, "prod", True, True), Step.KEEP),  # linked before
        (Facts(Own.JOBS, "prod", True, True), Step.KEEP),  # the folder was its own first
        (Facts(Own.EMPTY, "prod", True, False), Step.REPLACE),
        (Facts(Own.LINK, "prod", True, False), Step.REPLACE),
        (Facts(Own.QUEUED, "prod", True, False), Step.MERGE),
        (Facts(Own.JOBS, "prod", True, False), Step.KEEP_OWN),
    ],
)
def test_what_the_new_real_env_does_with_its_folder(facts: Facts, todo: Step) -> None:
    assert step(facts) is todo


def _job(root: Path, name: str, *, pod: bool = False) -> None:
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "jobs" / f"{name}.json").write_text("{}")
    if pod:
        (root / "pods" / f"{name}-worker-0").mkdir(parents=True)


def test_the_machine_s_jobs_follow_the_real_env_there_and_back(tmp_path: Path) -> None:
    base = tmp_path / "local"
    _job(base / "prod", "keep", pod=True)
    assert hand_over(base, "standby", "prod") is Step.LINK
    assert (base / "standby").is_symlink()
    assert (base / "standby").resolve() == (base / "prod").resolve()
    assert (base / "standby" / "jobs" / "keep.json").exists()
    assert hand_over(base, "standby", "prod") is Step.KEEP  # again: nothing to do
    # promoted back: prod's folder is the machine's already
    assert hand_over(base, "prod", "standby") is Step.KEEP
    # a third env takes over from the link: it links to the folder itself
    assert hand_over(base, "third", "standby") is Step.LINK
    assert (base / "third").resolve() == (base / "prod").resolve()


def test_jobs_submitted_before_the_operator_ran_are_moved_in(tmp_path: Path) -> None:
    base = tmp_path / "local"
    _job(base / "prod", "keep", pod=True)
    _job(base / "standby", "early")  # `job submit` to it, before its operator made the link
    _job(base / "standby", "keep")  # a name the machine's folder has: left aside
    assert facts_of(base, "standby", "prod").own is Own.QUEUED
    assert hand_over(base, "standby", "prod") is Step.MERGE
    assert (base / "standby").is_symlink()
    assert (base / "prod" / "jobs" / "early.json").exists()
    (aside,) = base.glob(".standby.before-*")
    assert (aside / "jobs" / "keep.json").exists()


def test_an_env_with_running_jobs_of_its_own_keeps_them(tmp_path: Path) -> None:
    base = tmp_path / "local"
    _job(base / "prod", "keep", pod=True)
    _job(base / "standby", "mine", pod=True)
    assert hand_over(base, "standby", "prod") is Step.KEEP_OWN
    assert not (base / "standby").is_symlink()
