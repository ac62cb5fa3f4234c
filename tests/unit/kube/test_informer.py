"""The one informer (jobs, pods, ConfigMaps): list, watch from the list's version, resume
from the last version seen, list again at once on 410 Gone, back off on anything else
(saying why), stop at once. Against a scripted list/watch: the API server's part is
tested with a real one in tests/integration/k8s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.backoff import Backoff
from dlrover_events.kube.informer import KubeInformer

#: bound of every wait here; each should take milliseconds
DEADLINE_S = 10.0


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


@dataclass
class Script:
    """What the fake server answers: one entry per list, one per watch, in order. A watch
    entry is the events it sends then ends, or an exception it raises after them; once
    the script is used up a watch hangs (as a long poll does)."""

    lists: list[tuple[list[dict[str, Any]], str] | BaseException]
    watches: list[list[tuple[str, dict[str, Any]] | BaseException]]
    #: what was asked: ("list",) or ("watch", version)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    listed: list[list[str]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def list_(self) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list",))
        self.changed.set()
        answer = self.lists.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def watch(self, version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.calls.append(("watch", version))
        self.changed.set()
        if not self.watches:
            await asyncio.Future()  # hangs until cancelled
        for item in self.watches.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item

    async def on_list(self, items: list[dict[str, Any]]) -> None:
        self.listed.append([i["metadata"]["name"] for i in items])

    async def on_event(self, typ: str, o: dict[str, Any]) -> None:
        self.events.append((typ, o["metadata"]["name"]))

    def informer(self, retry_s: float = 60.0, max_retry_s: float = 60.0) -> KubeInformer:
        return KubeInformer(
            "things of test",
            self.list_,
            self.watch,
            on_list=self.on_list,
            on_event=self.on_event,
            backoff=Backoff(initial_s=retry_s, max_s=max_retry_s),
        )

    async def until_calls(self, n: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.calls) < n:
                self.changed.clear()
                await self.changed.wait()


async def run_until_calls(script: Script, informer: KubeInformer, n: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(informer.run(stop))
    try:
        await script.until_calls(n)
    finally:
        stop.set()
        async with asyncio.timeout(DEADLINE_S):
            await task


async def test_lists_then_watches_from_the_lists_version_and_resumes_from_the_last_seen() -> None:
    script = Script(
        lists=[([obj("a", "5")], "10")],
        watches=[
            [("ADDED", obj("b", "11")), ("BOOKMARK", obj("", "14"))],  # then the server ends it
            [("MODIFIED", obj("a", "15")), ("DELETED", obj("b", "16"))],
        ],
    )
    informer = script.informer()
    await run_until_calls(script, informer, 4)
    assert script.calls == [("list",), ("watch", "10"), ("watch", "14"), ("watch", "16")]
    assert script.listed == [["a"]]
    # a bookmark only moves the version on; it is not a change
    assert script.events == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert informer.synced.is_set() and informer.lists == 1


@pytest.mark.parametrize("how", ["raised", "error event"])
async def test_a_410_lists_again_at_once(how: str, caplog: pytest.LogCaptureFixture) -> None:
    gone: tuple[str, dict[str, Any]] | BaseException = (
        ApiException(status=410, reason="Gone")
        if how == "raised"
        else ("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})
    )
    script = Script(
        lists=[([obj("a", "5")], "10"), ([obj("a", "5"), obj("c", "30")], "31")],
        watches=[[("ADDED", obj("b", "11")), gone]],
    )
    caplog.set_level(logging.INFO, "dlrover_events.kube.informer")
    # A backoff of 60 s would outlast the bounded wait: the second list comes at once.
    await run_until_calls(script, script.informer(retry_s=60.0), 4)
    assert script.calls == [("list",), ("watch", "10"), ("list",), ("watch", "31")]
    assert script.listed == [["a"], ["a", "c"]]
    assert "410 Gone" in caplog.text and "listing again" in caplog.text


async def test_a_failure_is_logged_with_why_and_listed_again_after_the_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(
        lists=[
            ConnectionRefusedError("connect to 127.0.0.1:6443"),
            TimeoutError("list timed out"),
            ConnectionRefusedError("connect to 127.0.0.1:6443"),
            ([obj("a", "5")], "10"),
            ([obj("a", "5")], "12"),
        ],
        watches=[[ApiException(status=500, reason="Internal Server Error")]],
    )
    informer = script.informer(retry_s=0.01, max_retry_s=0.02)
    await run_until_calls(script, informer, 7)
    assert script.calls == [*[("list",)] * 4, ("watch", "10"), ("list",), ("watch", "12")]
    assert script.listed == [["a"], ["a"]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4, warnings
    assert "connect to 127.0.0.1:6443" in warnings[0] and "list timed out" in warnings[1]
    assert "500 Internal Server Error" in warnings[3]
    # one backoff: doubling to its bound, and from the start again after a good list
    delays = [w.rsplit("listing again in ", 1)[1] for w in warnings]
    assert delays == ["0.01 s", "0.02 s", "0.02 s", "0.01 s"]
    # the cluster away is one line; no traceback for it
    assert not any(r.exc_info for r in caplog.records)


async def test_a_bug_in_the_callers_handler_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(lists=[([obj("a", "5")], "10"), ([], "11")], watches=[])
    broken = True

    async def on_list(items: list[dict[str, Any]]) -> None:
        nonlocal broken
        if broken:
            broken = False
            raise KeyError("spec")
        await script.on_list(items)

    informer = KubeInformer(
        "things",
        script.list_,
        script.watch,
        on_list=on_list,
        on_event=script.on_event,
        backoff=Backoff(initial_s=0.01),
    )
    await run_until_calls(script, informer, 3)
    assert script.listed == [[]] and informer.lists == 1  # the second list got through
    bug = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "KeyError" in bug.getMessage() and bug.exc_info is not None


async def test_stop_cuts_a_watch_in_flight() -> None:
    script = Script(lists=[([], "1")], watches=[])  # the watch hangs, as a long poll
    informer = script.informer()
    stop = asyncio.Event()
    task = asyncio.create_task(informer.run(stop))
    await script.until_calls(2)
    stop.set()
    async with asyncio.timeout(DEADLINE_S):
        await task
    assert script.calls == [("list",), ("watch", "1")]
