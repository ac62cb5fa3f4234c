"""Connecting to Kafka: the arguments every aiokafka client of the project is built with
(address, TLS, SASL, from Settings), starting a client, and asking what partitions a topic
has, in one place, so a broker that is away, or that refuses us, is one error a user
understands, whoever meets it.

A refusal is told apart from an absence by asking the broker again, once, with one bare
connection: aiokafka's own start says only "unable to bootstrap" (the reason goes to its
log). A TLS client that meets a plaintext listener would wait out the request timeout (the
broker waits for the rest of a "request" that is a TLS hello), so when a TLS start has not
finished within a second, the same listener is asked in plaintext: an answer means TLS
was never going to work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context

from dlrover_events.errors import BusRefused, BusUnavailable, UserError
from dlrover_events.lifecycle import close_quietly
from dlrover_events.settings import ENV_PREFIX, Settings, SettingsError

#: how long a TLS start may take before the listener is asked whether it speaks plaintext
PLAINTEXT_SNIFF_AFTER_S = 1.0
#: how long a diagnosis waits for a TLS alert after a handshake (a refused certificate)
ALERT_WAIT_S = 1.0
#: how long a start already under way may go on when its caller is cancelled (see
#: `start_kafka_client`)
START_FINISH_S = 1.0


def kafka_connection(settings: Settings) -> dict[str, Any]:
    """The keyword arguments that connect an aiokafka client (producer, consumer, admin)
    as the settings say: the bootstrap servers, the protocol, TLS and SASL credentials.

    Files are read now (a rotated certificate or password is picked up by the next client);
    one that cannot be read is a settings error naming the variable.
    """
    args: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        args["ssl_context"] = ssl_context(settings)
    if settings.security_protocol.startswith("SASL_"):
        args["sasl_mechanism"] = settings.sasl_mechanism
        args["sasl_plain_username"] = settings.sasl_username
        args["sasl_plain_password"] = sasl_password(settings)
    return args


def sasl_password(settings: Settings) -> str:
    if settings.sasl_password is not None:
        return settings.sasl_password.get_secret_value()
    if settings.sasl_password_file is None:
        raise SettingsError(f"{ENV_PREFIX}SASL_PASSWORD or {ENV_PREFIX}SASL_PASSWORD_FILE is unset")
    text = _read("SASL_PASSWORD_FILE", settings.sasl_password_file).decode()
    # a Secret mounted from a file written by `echo` ends with a newline that is no part
    # of the password
    return text.removesuffix("\n").removesuffix("\r")


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """A client TLS context: the brokers' CA (the system's when unset), the client's
    certificate for mutual TLS, and the hostname check as set.

    Rebuilt only when a file changes, so the many clients of one process share it.
    """
    files = (settings.ssl_cafile, settings.ssl_certfile, settings.ssl_keyfile)
    stamps = tuple(_stamp(var, f) for var, f in zip(_SSL_VARS, files, strict=True))
    key_password = settings.ssl_key_password
    cache_key = (*stamps, settings.ssl_check_hostname, key_password)
    if cache_key != _ssl_cache[0] or _ssl_cache[1] is None:
        _ssl_cache[:] = [cache_key, _new_ssl_context(settings)]
    context = _ssl_cache[1]
    assert context is not None
    return context


_SSL_VARS = ("SSL_CAFILE", "SSL_CERTFILE", "SSL_KEYFILE")
_ssl_cache: list[Any] = [None, None]


def _stamp(var: str, path: Path | None) -> tuple[str, int] | None:
    if path is None:
        return None
    try:
        return str(path), os.stat(path).st_mtime_ns
    except OSError as err:
        raise _unreadable(var, path, err) from None


def _new_ssl_context(settings: Settings) -> ssl.SSLContext:
    cafile, certfile, keyfile = settings.ssl_cafile, settings.ssl_certfile, settings.ssl_keyfile
    try:
        context = create_ssl_context(cafile=cafile)
    except (ssl.SSLError, OSError) as err:
        raise _unusable("SSL_CAFILE", cafile, err) from None
    if certfile is not None:
        password = settings.ssl_key_password
        try:
            # never OpenSSL's prompt on the terminal for an encrypted key: a service has none
            context.load_cert_chain(
                certfile, keyfile, password.get_secret_value() if password is not None else ""
            )
        except (ssl.SSLError, OSError) as err:
            raise _unusable("SSL_CERTFILE", certfile, err, keyfile) from None
    context.check_hostname = settings.ssl_check_hostname
    return context


def _unusable(
    var: str, path: Path | None, err: Exception, keyfile: Path | None = None
) -> SettingsError:
    what = f"{ENV_PREFIX}{var} {path}"
    if keyfile is not None:
        what += f" (key {ENV_PREFIX}SSL_KEYFILE {keyfile})"
    reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
    return SettingsError(f"{what} cannot be used for TLS: {reason}")


def _read(var: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise _unreadable(var, path, err) from None


def _unreadable(var: str, path: Path, err: OSError) -> SettingsError:
    return SettingsError(f"cannot read {ENV_PREFIX}{var} {path}: {err.strerror or err}")


def _unavailable(settings: Settings, err: object) -> BusUnavailable:
    return BusUnavailable(
        f"cannot reach Kafka at {settings.bootstrap_servers} ({err}); start the embedded "
        "stack with `dlrover-events up` or set DLROVER_EVENTS_BOOTSTRAP_SERVERS",
        reason=str(err),
    )


async def start_kafka_client(client: Any, settings: Settings) -> None:
    """Start an aiokafka client; if the broker cannot be reached or refuses us, release the
    client and raise the one error a user sees for it (`BusUnavailable`: time may mend
    it; `BusRefused`: the settings must change)."""
    start = asyncio.ensure_future(client.start())
    try:
        if settings.security_protocol in ("SSL", "SASL_SSL"):
            done, _ = await asyncio.wait({start}, timeout=PLAINTEXT_SNIFF_AFTER_S)
            if not done and await _speaks_plaintext(settings):
                raise _tls_to_plaintext(settings)
        await asyncio.shield(start)  # (a cancellation of ours is handled below)
    except (KafkaError, *_SCRAM_REFUSALS) as err:
        await _release(client)
        raise await diagnose(settings, err) from None
    except BaseException:
        if not start.done():
            # aiokafka's bootstrap closes its first connection on a Kafka error or a
            # timeout but not on a cancellation: cancelled while its metadata request is
            # out, it drops the socket open ("Unclosed AIOKafkaConnection" when collected;
            # seen when `up` stopped a service that was starting). A start that is that far
            # ends within milliseconds, so it may finish first; one that is stuck is cut.
            with contextlib.suppress(BaseException):
                await asyncio.wait({start}, timeout=START_FINISH_S)
        if not start.done():
            start.cancel()
        with contextlib.suppress(BaseException):
            await start
        await _release(client)
        raise


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop a consumer and close its connections, also where aiokafka's own stop does not.

    aiokafka 0.14's fetcher, closing, cancels its fetches in flight and awaits each one
    unguarded: a fetch that failed (a broker that timed out or went away) and is sleeping
    out its retry backoff raises its cancellation out of `stop()`, which then never closes
    the client (aio-libs/aiokafka#647). The caller would see a CancelledError nobody asked
    for and keep open sockets and a metadata task. Such a cancellation is absorbed here
    and the stop finished; a cancellation of the caller's own task still propagates.
    """
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        # what a stop cut short left running: the fetches, and the fetch loop itself when
        # the group coordinator's close was the one that raised
        fetcher = consumer._fetcher
        running = [fetcher._fetch_task, *fetcher._pending_tasks] if fetcher else []
        left = [t for t in running if t is not None and not t.done()]
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await consumer._client.close()


async def _release(client: Any) -> None:
    stop = getattr(client, "stop", None) or client.close
    await close_quietly(stop())


async def diagnose(settings: Settings, err: object) -> UserError:
    """Why a client could not start: ask the first bootstrap server again with one bare
    connection and name what refused us (TLS, SASL), or else say the bus is unreachable."""
    host, port = _first_server(settings)
    where = f"Kafka at {settings.bootstrap_servers}"
    try:
        args = kafka_connection(settings)
    except UserError as bad:
        return bad
    args.pop("bootstrap_servers")
    try:
        conn = await create_conn(
            host,
            port,
            client_id=f"{settings.client_id}-probe",
            request_timeout_ms=settings.request_timeout_ms,
            **args,
        )
    except ssl.SSLCertVerificationError as cert:
        hint = (
            f"; connect by a name the certificate holds, or set {ENV_PREFIX}SSL_CHECK_HOSTNAME"
            "=false"
            if "mismatch" in str(cert.verify_message).lower()
            else f"; set {ENV_PREFIX}SSL_CAFILE to the CA that signed it"
        )
        return BusRefused(
            f"TLS: {where} has a certificate this client rejects ({cert.verify_message}){hint}"
        )
    except ssl.SSLError as tls:
        return _tls_refused(settings, tls)
    except SaslAuthenticationFailed as sasl:
        return BusRefused(
            f"{where} refused user {settings.sasl_username!r} ({settings.sasl_mechanism}): "
            f"wrong username or password ({sasl})"
        )
    except UnsupportedSaslMechanismError:
        return BusRefused(
            f"{where} does not accept SASL {settings.sasl_mechanism} (is it a SASL listener "
            f"with that mechanism? {ENV_PREFIX}SECURITY_PROTOCOL={settings.security_protocol})"
        )
    except IllegalSaslStateError as sasl:
        return BusRefused(f"SASL {settings.sasl_mechanism} with {where} failed ({sasl})")
    except _SCRAM_REFUSALS as scram:
        if isinstance(scram, KeyError):
            # the final message of the broker's SCRAM holds no proof: RFC 5802's `e=`
            # server-error, a refusal aiokafka does not name
            return BusRefused(
                f"{where} refused user {settings.sasl_username!r} ({settings.sasl_mechanism}): "
                "wrong username or password (a SCRAM server-error)"
            )
        return BusRefused(
            f"SASL {settings.sasl_mechanism} with {where} failed ({scram}): is it the broker "
            "you meant?"
        )
    except (OSError, KafkaError, TimeoutError) as other:
        if isinstance(other, OSError) and not isinstance(other, TimeoutError):
            # refused, no route, no such host: nothing listens to ask further
            return _unavailable(settings, other)
        secure = settings.security_protocol in ("SSL", "SASL_SSL")
        if secure and (alert := await _tls_alert(settings, args["ssl_context"])) is not None:
            return _tls_refused(settings, alert)
        if not secure and await _speaks_tls(settings):
            return BusRefused(
                f"{where} speaks TLS but {ENV_PREFIX}SECURITY_PROTOCOL="
                f"{settings.security_protocol}: set SSL (or SASL_SSL)"
            )
        if secure and await _speaks_plaintext(settings):
            return _tls_to_plaintext(settings)
        if settings.security_protocol.startswith("SASL_") and await _answers_without_sasl(
            settings, args.get("ssl_context")
        ):
            # up, and it speaks our transport: the login is what it hung up on
            return BusRefused(
                f"{where} closed the connection at the SASL {settings.sasl_mechanism} login: "
                f"does it accept {settings.sasl_mechanism}?"
            )
        return _unavailable(settings, other or err)
    conn.close()
    return _unavailable(settings, err)


#: what aiokafka's SCRAM client raises on an answer it cannot use: a server-final message
#: with an error instead of the server's proof (KeyError 'v'), a wrong nonce or proof
_SCRAM_REFUSALS = (KeyError, ValueError)


def _tls_refused(settings: Settings, err: ssl.SSLError) -> BusRefused:
    hint = ""
    if "CERTIFICATE_REQUIRED" in str(err).upper() and settings.ssl_certfile is None:
        hint = (
            f"; the broker wants a client certificate: set {ENV_PREFIX}SSL_CERTFILE "
            f"and {ENV_PREFIX}SSL_KEYFILE"
        )
    return BusRefused(
        f"TLS handshake with Kafka at {settings.bootstrap_servers} failed "
        f"({err.reason or err}){hint}"
    )


async def _tls_alert(settings: Settings, context: ssl.SSLContext) -> ssl.SSLError | None:
    """The TLS alert that ends a connection right after the handshake: with TLS 1.3 a
    broker refuses a client certificate, or the lack of one, only then, and aiokafka
    reports just a closed connection. Nothing is sent (a request the broker has not read
    when it closes would reset the connection before its alert is read); a broker that
    accepted us says nothing, and the wait ends after `ALERT_WAIT_S`."""
    host, port = _first_server(settings)
    try:
        async with asyncio.timeout(settings.request_timeout_ms / 1000):
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
    except ssl.SSLError as alert:
        return alert
    except (OSError, TimeoutError):
        return None
    try:
        async with asyncio.timeout(ALERT_WAIT_S):
            await reader.read(1)
    except ssl.SSLError as alert:
        return alert
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()
    return None


def _tls_to_plaintext(settings: Settings) -> BusRefused:
    return BusRefused(
        f"Kafka at {settings.bootstrap_servers} answers in plaintext but "
        f"{ENV_PREFIX}SECURITY_PROTOCOL={settings.security_protocol}: is that its TLS listener?"
    )


def _first_server(settings: Settings) -> tuple[str, int]:
    host, port, _ = collect_hosts(settings.bootstrap_servers, randomize=False)[0]
    return host, port


async def _speaks_plaintext(settings: Settings) -> bool:
    """Whether the first bootstrap server answers a plaintext Kafka request."""
    host, port = _first_server(settings)
    try:
        conn = await create_conn(
            host,
            port,
            client_id=f"{settings.client_id}-probe",
            request_timeout_ms=settings.request_timeout_ms,
        )
    except (OSError, KafkaError, TimeoutError):
        return False
    conn.close()
    return True


async def _answers_without_sasl(settings: Settings, context: ssl.SSLContext | None) -> bool:
    """Whether the first bootstrap server answers a request (ApiVersions, which a broker
    takes before a login) on our transport, SASL left out."""
    host, port = _first_server(settings)
    try:
        conn = await create_conn(
            host,
            port,
            client_id=f"{settings.client_id}-probe",
            request_timeout_ms=settings.request_timeout_ms,
            security_protocol="SSL" if context is not None else "PLAINTEXT",
            ssl_context=context,
        )
    except (OSError, KafkaError, TimeoutError):
        return False
    conn.close()
    return True


async def _speaks_tls(settings: Settings) -> bool:
    """Whether the first bootstrap server completes a TLS handshake (certificate unchecked:
    this only tells a TLS listener from a plaintext one)."""
    host, port = _first_server(settings)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(settings.request_timeout_ms / 1000):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def topic_partitions(consumer: AIOKafkaConsumer, topic_name: str) -> list[TopicPartition]:
    """The partitions of a topic as the broker knows them now (empty: no such topic).

    A group-less consumer only learns metadata for what it is assigned, so refresh first.
    """
    await consumer._client.force_metadata_update()
    ids = consumer.partitions_for_topic(topic_name) or set()
    return [TopicPartition(topic_name, p) for p in sorted(ids)]


__all__ = [
    "diagnose",
    "kafka_connection",
    "sasl_password",
    "ssl_context",
    "start_kafka_client",
    "stop_consumer",
    "topic_partitions",
]
