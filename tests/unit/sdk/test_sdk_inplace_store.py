"""An in-place member's dealings with the job's store, in one process: a newcomer waiting
for admission whose store goes away takes the restart path (ReformFailed, not a crash),
and one told to stop before it was admitted withdraws and leaves."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import torch.distributed as dist
from torch import nn

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.torch.inplace import InPlaceGroup, InPlaceSettings, ReformFailed


def waiting_joiner() -> tuple[dist.TCPStore, InPlaceGroup, dict[str, Any], threading.Thread]:
    """A store host (the test) and a newcomer registered in it, waiting to be admitted."""
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    host.set("epoch", "e1")
    settings = InPlaceSettings("127.0.0.1", port, hosts_store=False, timeout_s=5)
    group = InPlaceGroup(settings, member="m", handle_sigterm=False)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            group.join(nn.Linear(2, 2))
            result["joined"] = True
        except ReformFailed as err:
            result["failed"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while int(host.add("joiners", 0)) < 1:
        assert time.monotonic() < deadline, "the newcomer never registered"
        time.sleep(0.02)
    return host, group, result, thread


def test_a_newcomer_whose_store_goes_away_takes_the_restart_path() -> None:
    host, _, result, thread = waiting_joiner()
    del host  # the store's host is gone (its process died)
    gc.collect()
    thread.join(60)
    assert "failed" in result, result
    assert "joining failed" in str(result["failed"])


def test_a_newcomer_told_to_stop_before_admission_withdraws() -> None:
    host, group, result, thread = waiting_joiner()
    group.request_leave()  # its pod was removed (SIGTERM) while it waited
    thread.join(60)
    assert result == {"joined": True} and group.left
    assert host.check(["joiner/1/withdrawn"])  # no generation will wait for it
