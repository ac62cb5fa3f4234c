"""`dlrover-events agent`: one per plain host. It follows its host's orders on
``<env>.hosts.orders`` (the operator's, keyed by host name), runs them as pods
(handlers.agent.pods), and reports its slots, its address and its pods on
``<env>.hosts.reports`` every heartbeat and at every change.

It needs the bus (address and credentials: the install's one settings loader) and a
working directory, nothing else: no inbound port, no database. It acts only on orders
once it has read every order there was when it started (the topic is compacted: the
latest orders of its host are all it needs), so a restarted agent never stops a pod its
orders still want; its predecessor's pods it takes back from their pid files.

A name another live agent reports under is refused at the start: the latest report of
the host, if younger than a few heartbeats and from another run than this working
directory's last one, means another machine has the name (handlers.agent.naming). A
restart within those heartbeats reports at once, without reading the bus: the operator
counts a host lost after its ``lost_after_s``, and a check that read the hosts' reports
first made a restarted agent's first report late enough for its pods to be replaced.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.compacted import CompactedFollower
from dlrover_events.bus.dead_letters import dead_letter, log_dead_letters, send_dead_letters
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topics
from dlrover_events.bus.topics import HOSTS_ORDERS, HOSTS_REPORTS, check_env_name, topic
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import cancel_and_wait, wait_or_stop
from dlrover_events.pods.environment import node_env
from dlrover_events.pods.files import read_json, write_json
from dlrover_events.pods.memory import available
from dlrover_events.settings import Settings
from handlers.agent.naming import LOOKBACK_S, latest_report, name_taken, restarted_in_time
from handlers.agent.pods import HostPods
from handlers.agent.slots import UnreadableGpus, discover
from schemas.codec import CodecError, check_env, decode
from schemas.dlq import DeadLetter, FailureKind
from schemas.hosts import HostOrders, HostReported, OrderedPod, Slot, check_host_name

log = logging.getLogger(__name__)

#: The agent's own record in its working directory: the id of the last run that reported
#: from it, under which name, when last and how often (handlers.agent.naming).
AGENT_FILE = "agent.json"
SOURCE = "agent"


class AgentSettings(BaseSettings):
    """The agent's knobs (DLROVER_EVENTS_AGENT_*), options on top; the bus is the
    install's (DLROVER_EVENTS_BOOTSTRAP_SERVERS, TLS and SASL as every client)."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_AGENT_", extra="ignore")

    env: str | None = Field(
        default=None,
        description="the env whose operator it obeys (`--env`); unset: the env that is real "
        "now, as the bus says",
    )
    host: str | None = Field(
        default=None,
        description="this host's name among the env's agents; unset: its host name",
    )
    workdir: Path = Field(
        default=Path("~/.dlrover-events/agent"),
        description="where it keeps its pods (pid files, logs, endings) across restarts",
    )
    artificial_slots: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="a CPU-only host's slots (unset: its GPUs, from nvidia-smi)",
    )
    address: str | None = Field(
        default=None,
        description="where other hosts reach this one (a job's rendezvous on it listens "
        "there); unset: this host's address on its route to the bus",
    )
    heartbeat_s: float = Field(
        default=1.0, gt=0, le=30, description="how often it reports when nothing changes"
    )
    poll_s: float = Field(
        default=0.25, gt=0, le=10, description="how often it looks at its pods' processes"
    )
    fence_after_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="cut from the bus this long, it kills its pods (0: never): the operator "
        "counted them gone after its lost_after_s and replaced them, and a pod that lived on "
        "would come back into its job's rendezvous as a stale member (torchrun closes the "
        "rendezvous when such a node fails)",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else check_host_name(value)

    @field_validator("env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        return None if value is None else check_env_name(value)


def route_address(bootstrap_servers: str) -> str:
    """This host's address on its route to the bus's first server (no packet is sent: a
    UDP socket's connect only picks the route)."""
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    host = host.strip("[]") or first
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, int(port or 9092)))
            return str(sock.getsockname()[0])
    except (OSError, ValueError):
        return "127.0.0.1"


class Agent:
    """One host's agent in one env."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        conf: AgentSettings,
        *,
        slots: list[Slot] | None = None,
        artificial: bool = True,
    ) -> None:
        self.settings = settings
        self.env = env
        self.conf = conf
        self.host = conf.host or check_host_name(socket.gethostname() or "host")
        self.workdir = conf.workdir.expanduser().resolve()
        self.agent_id = uuid.uuid4().hex
        self.address = conf.address or route_address(settings.bootstrap_servers)
        if slots is None:
            try:
                slots, artificial = discover(conf.artificial_slots)
            except UnreadableGpus as e:
                raise UserError(f"agent: cannot read this host's GPUs: {e}") from None
        self.slots = slots
        self.artificial = artificial
        self.pods = HostPods(
            self.workdir,
            base_env=node_env(settings.bootstrap_servers),
            gpus=not artificial,
            enforcement=available(),
        )
        #: the latest orders of this host (None: not all read yet)
        self.orders: list[OrderedPod] | None = None
        self._letters: list[DeadLetter] = []
        self.ready = asyncio.Event()

    # -- orders in ------------------------------------------------------------------------

    def _take(self, records: list[ConsumerRecord]) -> None:
        mine = self.host.encode()
        for record in records:
            if record.key != mine:
                continue  # another host's orders: none of this one's business
            if record.value is None:
                self.orders = []  # the operator forgot this host
                continue
            try:
                event = check_env(decode(record.value), self.env, record.topic)
                if not isinstance(event, HostOrders) or event.host != self.host:
                    raise CodecError(
                        FailureKind.INVALID,
                        f"a {event.type} keyed {self.host!r}, not this host's orders",
                    )
            except CodecError as e:
                self._letters.append(
                    dead_letter(self.env, record, e.kind, e.message, f"agent-{self.host}")
                )
                continue
            self.orders = list(event.pods)

    # -- reports out ----------------------------------------------------------------------

    def report(self) -> HostReported:
        return HostReported(
            env=self.env,
            source=SOURCE,
            host=self.host,
            agent_id=self.agent_id,
            address=self.address,
            slots=self.slots,
            artificial=self.artificial,
            pods=self.pods.states(),
            heartbeat_s=self.conf.heartbeat_s,
        )

    async def _check_name(self) -> bool:
        """Refuse a host name another live agent reports under (handlers.agent.naming);
        whether the bus was read (not after a restart in time)."""
        own = read_json(self.workdir / AGENT_FILE)
        if restarted_in_time(own, self.host, time.time()):
            return False
        since = datetime.fromtimestamp(time.time() - LOOKBACK_S, UTC)
        records = await read_topics(
            self.settings,
            [topic(self.env, HOSTS_REPORTS)],
            client_id="agent",
            begin=since,
            timeout_s=10.0,
        )
        latest = latest_report(((r.key, r.value) for r in records), self.host)
        refusal = name_taken(latest, (own or {}).get("agent_id"), self.host, time.time())
        if refusal is not None:
            raise UserError(refusal)
        return True

    def _reported(self) -> None:
        """This run reported: the record a restart decides by (handlers.agent.naming).
        One not written only costs the next start a reading of the bus."""
        record = {
            "agent_id": self.agent_id,
            "host": self.host,
            "reported_at": time.time(),
            "heartbeat_s": self.conf.heartbeat_s,
        }
        try:
            write_json(self.workdir / AGENT_FILE, record)
        except OSError as e:
            log.warning("agent %s: its record not written: %s", self.host, e)

    async def run(self, stop: asyncio.Event) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        read = await self._check_name()
        log.info("agent %s: name checked %s", self.host, "on the bus" if read else "by its record")
        adopted = self.pods.adopted()
        if adopted:
            log.warning(
                "agent %s: took back %d running pod(s): %s", self.host, len(adopted), adopted
            )
        follower = CompactedFollower(
            self.settings,
            topic(self.env, HOSTS_ORDERS),
            self._take,
            client_id=f"agent-{self.host}",
            poll_ms=200,
            missing="`dlrover-events env create` and `up` make it (an env made before plain "
            "hosts lacks it: `env create` the env again)",
        )
        async with Producer(self.settings) as producer, follower:
            following = asyncio.create_task(follower.run(stop), name=f"agent.{self.host}.orders")
            try:
                await self._loop(stop, producer, follower)
            finally:
                await cancel_and_wait(following)

    async def _loop(
        self, stop: asyncio.Event, producer: Producer, follower: CompactedFollower
    ) -> None:
        log.warning(
            "agent %s of env %s: %d %s slot(s), reached at %s, pods under %s",
            self.host,
            self.env,
            len(self.slots),
            "artificial" if self.artificial else "GPU",
            self.address,
            self.workdir,
        )
        said: list[object] | None = None
        last = 0.0
        reached = asyncio.get_running_loop().time()
        fenced = False
        while not stop.is_set():
            if follower.caught_up.is_set():
                self.pods.apply(self.orders or [])
            if self._letters:
                letters, self._letters = self._letters, []
                log_dead_letters(letters)
                await send_dead_letters(producer, letters)
            now = self.report()
            loop = asyncio.get_running_loop()
            if now.pods != said or loop.time() - last >= self.conf.heartbeat_s:
                try:
                    # bounded: a bus away must not hold up the fence below
                    async with asyncio.timeout(max(1.0, 2 * self.conf.heartbeat_s)):
                        await producer.publish(now)
                    said, last = list(now.pods), loop.time()
                    reached, fenced = loop.time(), False
                    self._reported()
                    self.ready.set()
                except (KafkaError, TimeoutError) as e:
                    log.warning("agent %s: report not sent: %r", self.host, e)
            cut = loop.time() - reached
            if self.conf.fence_after_s and cut > self.conf.fence_after_s and not fenced:
                killed = self.pods.kill_all()
                fenced = True
                log.error(
                    "agent %s: cut from the bus for %.1f s: killed its %d pod(s) (the "
                    "operator counts them gone and replaces them)",
                    self.host,
                    cut,
                    len(killed),
                )
            await wait_or_stop(stop, self.conf.poll_s)


def agent_settings(**given: object) -> AgentSettings:
    """The agent's settings with what was given on top; a bad one is a one-line error."""
    try:
        return AgentSettings(**{k: v for k, v in given.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise UserError(f"agent setting {where}: {first['msg']}") from None


__all__ = ["Agent", "AgentSettings", "agent_settings", "route_address"]
