"""An experiment's trials share this machine with an ordinary job, with the ``random``
and ``grid`` searchers: test_experiment_loop.py's run and checks (its docstring says
what they are), in a file of their own so that pytest-xdist's --dist loadfile can put
them on the other worker than the ASHA run (together the three took one worker over six
minutes on two cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.local.conftest import Local
from tests.integration.local.test_experiment_loop import (
    an_experiment_shares_four_slots_with_a_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


@pytest.mark.parametrize("which", ["random", "grid"])
async def test_an_experiment_shares_four_slots_with_a_job(
    local: Local, tmp_path: Path, which: str
) -> None:
    await an_experiment_shares_four_slots_with_a_job(local, tmp_path, which)
