"""An in-place job's membership store (``dlrover_events.sdk.torch.inplace``): the records
its members keep in the role's ``TCPStore`` to join, to be admitted, to agree on the next
generation and to recover from a lost peer (docs/inplace.md, The protocol). What to
decide is pure (``dlrover_events.sdk.membership``); this is where the decisions are
written and read, the first written one winning (compare-and-set), so members that decide
at once still agree. The process group and the training state are not dealt with here."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch.distributed as dist

from dlrover_events.sdk.membership import (
    Check,
    Decision,
    Joiner,
    Survivor,
    first_generation,
    planned,
    recovered,
)
from dlrover_events.sdk.torch.inplace_settings import InPlaceSettings

#: the group's logger: what the store protocol says is the in-place group's word in the logs
log = logging.getLogger("dlrover_events.sdk.torch.inplace")

#: Seconds a newcomer waits for the store's host to come up (it may still import torch).
CONNECT_S = 300.0
#: How often a waiting process looks at the store or at its admission file.
POLL_S = 0.02


class ReformFailed(RuntimeError):
    """The group could not be re-formed in place: exit non-zero, the agent restarts it."""


class MembershipStore:
    """This member's view of the job's store. ``verify`` checks the store is still the one
    the group formed in; the other calls use it as it is (the protocol verifies at the
    points where a restarted host would otherwise go unnoticed)."""

    def __init__(self, settings: InPlaceSettings) -> None:
        self.settings = settings
        self._tcp: dist.TCPStore | None = None
        self._epoch = ""

    @property
    def tcp(self) -> dist.TCPStore:
        """The connected store (a process group is formed on a prefix of it)."""
        assert self._tcp is not None, "connect() first"
        return self._tcp

    def connect(self) -> None:
        """Reach the store (host it, on the host's member) and learn its epoch."""
        if self._tcp is not None:
            return
        s = self.settings
        store = dist.TCPStore(
            s.store_host,
            s.store_port,
            is_master=s.hosts_store,
            wait_for_workers=False,
            timeout=timedelta(seconds=CONNECT_S),
        )
        store.set_timeout(timedelta(seconds=s.timeout_s))
        if s.hosts_store:
            store.set("epoch", uuid.uuid4().hex)
        else:
            store.wait(["epoch"], timedelta(seconds=CONNECT_S))
        self._epoch = store.get("epoch").decode()
        self._tcp = store

    def verify(self) -> dist.TCPStore:
        """The store, checked to be the one this group formed in (its host restarted
        would be a new, empty store on the same port)."""
        store = self._tcp
        if store is None:
            raise ReformFailed("no store")
        try:
            epoch = store.get("epoch").decode()
        except Exception as err:
            raise ReformFailed(f"the job's store is gone: {first_line(err)}") from err
        if epoch != self._epoch:
            raise ReformFailed("the job's store was started again (its host restarted)")
        return store

    def process_group_store(self, generation: int) -> dist.Store:
        """Where ``generation``'s process group forms: its own prefix of the store."""
        return dist.PrefixStore(f"gen/{generation}/pg", self.tcp)

    # -- joining ---------------------------------------------------------------------------

    def register(self, member: str) -> int:
        """``member`` as a joiner; its ticket."""
        store = self.tcp
        ticket = int(store.add("joiners", 1))
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        record = Joiner(ticket, member, time.time(), os.getpid(), restarts)
        store.set(f"joiner/{ticket}", record.encode())
        return ticket

    def joiners(self, after: int, upto: int) -> list[Joiner]:
        """The joiners of tickets ``after + 1 .. upto`` that did not withdraw."""
        store = self.tcp
        out = []
        for ticket in range(after + 1, upto + 1):
            if store.check([f"joiner/{ticket}/withdrawn"]):
                continue
            store.wait([f"joiner/{ticket}"])
            out.append(Joiner.decode(store.get(f"joiner/{ticket}")))
        return out

    def first_formed(self) -> bool:
        return bool(self.tcp.check(["gen/0/next"]))

    def form_first(self) -> None:
        """On the host: the first generation, once the expected members registered or the
        settling time passed."""
        store = self.tcp
        deadline = time.monotonic() + self.settings.settle_s
        while int(store.add("joiners", 0)) < self.settings.expect and time.monotonic() < deadline:
            time.sleep(POLL_S)
        joiners = self.joiners(0, int(store.add("joiners", 0)))
        decision = self._decide("gen/0/next", first_generation(joiners))
        self._admit(joiners, decision)
        store.set("gen", str(decision.generation))

    def await_admission(self, ticket: int, leaving: Callable[[], bool]) -> Decision | None:
        """The generation that admitted ``ticket``; None when the member was told to leave
        first (it withdraws, so no generation waits for it)."""
        store = self.tcp
        key = f"admit/{ticket}"
        said = time.monotonic()
        while not store.check([key]):
            if leaving():
                store.set(f"joiner/{ticket}/withdrawn", "1")
                if not store.check([key]):
                    log.info("told to stop before being admitted: leaving")
                    return None
                break  # admitted meanwhile: join, and leave at the first boundary
            if time.monotonic() - said > 30:
                said = time.monotonic()
                log.info("waiting to be admitted to the job (ticket %d)", ticket)
            time.sleep(POLL_S)
        return Decision.decode(store.get(key))

    # -- the boundary check and re-forming ---------------------------------------------------

    def waiting(self, admitted: int) -> tuple[int, list[Joiner]]:
        """Rank 0's look at the boundary: the newest ticket and the joiners after the
        ``admitted`` ones. ReformFailed when the store is gone."""
        try:
            newest = int(self.tcp.add("joiners", 0))
            return newest, self.joiners(admitted, newest)
        except Exception as err:
            raise ReformFailed(f"the job's store is gone: {first_line(err)}") from err

    def propose(self, decision: Decision, check: Check, step: int) -> None:
        """On the first staying member: the next generation after ``check``, unless one is
        written already; its newcomers admitted."""
        joiners = self.joiners(decision.admitted, check.newest_ticket)
        nxt = planned(decision, check, joiners, step=step)
        if nxt is None:
            return
        nxt = self._decide(f"gen/{decision.generation}/next", nxt)
        self._admit([j for j in joiners if j.member in nxt.joined], nxt)
        self.tcp.set("gen", str(nxt.generation))

    def agreed(self, generation: int) -> Decision:
        """The generation agreed after ``generation`` (waits for it at most the timeout)."""
        return Decision.decode(self.tcp.get(f"gen/{generation}/next"))

    def survive(self, decision: Decision, member: str, step: int) -> Decision:
        """After a lost peer: register as a survivor of ``decision``'s generation; the first
        survivor waits for the others (all, or none more for ``recover_window_s``) and
        writes the next generation. The generation agreed."""
        store = self.tcp
        g = decision.generation
        key = f"gen/{g}/next"
        n = int(store.add(f"gen/{g}/survivors", 1))
        rank = decision.rank_of(member)
        me = Survivor(member, rank if rank is not None else -1, step)
        store.set(f"gen/{g}/survivor/{n}", me.encode())
        if n == 1 and not store.check([key]):
            count, changed = 1, time.monotonic()
            deadline = changed + self.settings.timeout_s
            while count < decision.world_size and time.monotonic() < deadline:
                time.sleep(POLL_S)
                now = int(store.add(f"gen/{g}/survivors", 0))
                if now != count:
                    count, changed = now, time.monotonic()
                elif time.monotonic() - changed >= self.settings.recover_window_s:
                    break
            survivors = []
            for i in range(1, count + 1):
                store.wait([f"gen/{g}/survivor/{i}"])
                survivors.append(Survivor.decode(store.get(f"gen/{g}/survivor/{i}")))
            nxt = self._decide(key, recovered(decision, survivors))
            store.set("gen", str(nxt.generation))
        return self.agreed(g)

    # -- writing decisions -----------------------------------------------------------------

    def _decide(self, key: str, decision: Decision) -> Decision:
        """Write ``decision`` at ``key`` unless another is there: the first one wins."""
        won = self.tcp.compare_set(key, "", decision.encode())
        return Decision.decode(won)

    def _admit(self, joiners: Iterable[Joiner], decision: Decision) -> None:
        for j in joiners:
            self.tcp.set(f"admit/{j.ticket}", decision.encode())


def first_line(err: BaseException) -> str:
    """An error's first line, short enough for a log line or a ReformFailed."""
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


__all__ = ["CONNECT_S", "POLL_S", "MembershipStore", "ReformFailed", "first_line"]
