"""Hosts made of network namespaces on this machine, for the hosts platform's tests: a
bridge in the root namespace with an address of the test's own, and per host a namespace
joined to it by a veth pair (``eth0`` inside), each with an address of a private /24 the
test picks at random (10.213.X.0/24), so runs side by side never meet. Everything made
is removed at the end, whatever happened (and a namespace's processes are killed first).

Each namespace resolves names as a cluster's hosts do: an /etc/hosts naming every host
and the bridge, and a resolver that answers at once (``ip netns exec`` puts
/etc/netns/<namespace>/* over /etc). Without them the machine's nameserver, which a
namespace cannot reach, made a reverse lookup wait 10 s for its timeout, and torch's c10d
looks up the name of a store connection's address (for its log): a process's first
TCPStore connection from one namespace to another took 10.0 s, 0.00 s with these files,
and a restart of the job's workers spent 10-20 s of its 25-31 s from the processes'
start to their group there.

Needs root and iproute2; ``available`` says whether this machine has them.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Where ``ip netns exec`` finds a namespace's own /etc files.
NETNS_ETC = Path("/etc/netns")
#: Nothing listens there inside a namespace: a name not in its hosts file fails at once.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def available() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@dataclass
class Namespaces:
    """The bridge and the namespaces of one test."""

    tag: str
    subnet: int
    bridge: str
    #: host name -> (namespace, root-side veth, address)
    hosts: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: where the namespaces reach the bus."""
        return f"10.213.{self.subnet}.1"

    def netns(self, host: str) -> str:
        return self.hosts[host][0]

    def address(self, host: str) -> str:
        return self.hosts[host][2]

    def exec(self, host: str) -> list[str]:
        """The command prefix that runs a command in the host's namespace."""
        return ["ip", "netns", "exec", self.netns(host)]

    def link(self, host: str, up: bool) -> None:
        """The host's cable: its veth's root end up or down."""
        ip("link", "set", self.hosts[host][1], "up" if up else "down")

    def pids(self, host: str) -> list[int]:
        done = ip("netns", "pids", self.netns(host), check=False)
        return [int(p) for p in done.stdout.split()]

    def kill_all(self, host: str) -> None:
        """SIGKILL to every process in the host's namespace (its agent and its pods)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def namespaces(hosts: list[str]) -> Iterator[Namespaces]:
    tag = uuid.uuid4().hex[:5]
    made = Namespaces(tag, random.randint(1, 254), f"dlbr{tag}")
    try:
        ip("link", "add", made.bridge, "type", "bridge")
        ip("addr", "add", f"{made.gateway}/24", "dev", made.bridge)
        ip("link", "set", made.bridge, "up")
        for n, host in enumerate(hosts, 1):
            ns, outside, inside = f"dl{tag}{host}", f"dl{tag}{n}o", f"dl{tag}{n}i"
            address = f"10.213.{made.subnet}.{10 + n}"
            ip("netns", "add", ns)
            made.hosts[host] = (ns, outside, address)
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            ip("link", "set", outside, "master", made.bridge)
            ip("link", "set", outside, "up")
            ip("link", "set", inside, "netns", ns)
            ip("-n", ns, "link", "set", inside, "name", "eth0")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", made.gateway)
        _name_hosts(made)
        yield made
    finally:
        for host in list(made.hosts):
            ns, outside, _ = made.hosts[host]
            made.kill_all(host)
            ip("link", "del", outside, check=False)
            ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        with contextlib.suppress(OSError):  # only if no one else's namespace has files there
            NETNS_ETC.rmdir()
        ip("link", "del", made.bridge, check=False)


def _name_hosts(made: Namespaces) -> None:
    """Every namespace's hosts file and resolver (the module's docstring says why)."""
    lines = ["127.0.0.1 localhost", f"{made.gateway} {made.bridge}"]
    lines += [f"{address} {host}" for host, (_, _, address) in made.hosts.items()]
    for ns, _, _ in made.hosts.values():
        etc = NETNS_ETC / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        (etc / "resolv.conf").write_text(RESOLV_CONF)


__all__ = ["Namespaces", "available", "namespaces"]
