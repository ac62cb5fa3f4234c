"""Where the SDK's code is found: its own folder, dlrover_events_sdk/, beside the other
packages of the environment, put on sys.path at interpreter start by
dlrover_events_sdk.pth, unless the full dlrover-events is installed.

The full distribution carries every module of the SDK; where both are installed, its code
serves every import (one copy of each module, the full one, whichever was installed last),
and the two distributions never own the same file, so either installs, upgrades or
uninstalls without touching the other. Alone, the SDK's folder serves
``dlrover_events.sdk``, ``dlrover_events.config.client`` and ``schemas`` under their usual
names, so a training script imports the same names with either install.
"""

from __future__ import annotations

import importlib.util
import os
import sys

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlrover_events_sdk")


def install() -> None:
    if FOLDER not in sys.path and importlib.util.find_spec("dlrover_events") is None:
        sys.path.append(FOLDER)
