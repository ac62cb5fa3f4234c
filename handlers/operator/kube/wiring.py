"""What a TrainingJob's pod is told besides who it is: where the bus is and how to reach
it (its security settings), where the gateway is and a read-scoped token for it, and where
its checkpoints go, as the local platform tells its processes. Without it the SDK in a
real pod reported to 127.0.0.1:9092.

Pure: `pod_wiring` turns the operator's settings into a `PodWiring` once (a setting that
would leave pods unable to connect is a one-line UserError at the operator's start), and
`PodWiring.apply` adds it to a pod spec. Secrets never go into a pod spec as values: the
SASL password and the gateway token are secretKeyRefs, the CA and a client certificate
Secret volumes. They name Secrets of the pod's own namespace (a pod can reference no
other): `bootstrap --jobs-namespace` puts the token's Secret there. A variable the user
set in the template wins.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from dlrover_events.config.client import TOKEN_ENV, URL_ENV
from dlrover_events.errors import UserError
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.settings import ENV_PREFIX, Settings

#: where a pod finds the Kafka CA and its client certificate (Secret volumes)
CA_DIR = "/etc/dlrover-events/kafka-ca"
CERT_DIR = "/etc/dlrover-events/kafka-cert"
CA_VOLUME = "dlrover-events-kafka-ca"
CERT_VOLUME = "dlrover-events-kafka-cert"
#: the operator's settings for its pods (DLROVER_EVENTS_OPERATOR_*), as errors name them
_OPT = f"{ENV_PREFIX}OPERATOR_"


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret in the pod's namespace."""

    name: str
    key: str

    @classmethod
    def parse(cls, text: str, setting: str) -> SecretKey:
        """``NAME:KEY`` (a Secret's name and one of its keys)."""
        name, _, key = text.partition(":")
        if not name.strip() or not key.strip():
            raise UserError(f"{setting}={text!r}: give it as SECRET:KEY, e.g. kafka-user:password")
        return cls(name.strip(), key.strip())

    def ref(self) -> dict[str, Any]:
        return {"secretKeyRef": {"name": self.name, "key": self.key}}


@dataclass(frozen=True)
class PodWiring:
    """Variables (plain, or from a Secret's key), the gateway token's Secret (its key is
    the env the job runs in), and Secret volumes: what `apply` adds to every container."""

    values: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, SecretKey], ...] = ()
    #: the Secret holding each env's read token under the env's name (None: no gateway)
    token_secret: str | None = None
    #: (volume, Secret, mount path)
    volumes: tuple[tuple[str, str, str], ...] = ()
    #: what the operator should say at its start (a pod that will lack something)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def env_vars(self, env: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in self.values]
        found += [{"name": k, "valueFrom": ref.ref()} for k, ref in self.secrets]
        if self.token_secret is not None:
            token = SecretKey(self.token_secret, env)
            found.append({"name": TOKEN_ENV, "valueFrom": token.ref()})
        return found

    def apply(self, spec: dict[str, Any], env: str) -> None:
        """Add the wiring to the pod ``spec`` of a job of ``env`` (in place): to each
        container the variables and mounts it does not set itself, to the pod the volumes
        it lacks."""
        wanted = self.env_vars(env)
        for container in spec.get("containers") or []:
            own = container.get("env") or []
            have = {e.get("name") for e in own}
            container["env"] = own + [e for e in wanted if e["name"] not in have]
            mounts = container.get("volumeMounts") or []
            taken = {m.get("mountPath") for m in mounts}
            mounts += [
                {"name": volume, "mountPath": path, "readOnly": True}
                for volume, _, path in self.volumes
                if path not in taken
            ]
            if mounts:
                container["volumeMounts"] = mounts
        if self.volumes:
            volumes = spec.get("volumes") or []
            named = {v.get("name") for v in volumes}
            volumes += [
                {"name": volume, "secret": {"secretName": secret}}
                for volume, secret, _ in self.volumes
                if volume not in named
            ]
            spec["volumes"] = volumes


def _file(folder: str, given: object, default: str) -> str:
    """The file a pod reads in ``folder``: the operator's own file's name, else ``default``
    (the key of the Secret it is mounted from)."""
    return posixpath.join(folder, posixpath.basename(str(given)) if given else default)


def pod_wiring(
    settings: Settings,
    *,
    bootstrap_servers: str | None = None,
    gateway_url: str | None = None,
    token_secret: str | None = None,
    sasl_username: str | None = None,
    sasl_password_secret: str | None = None,
    ca_secret: str | None = None,
    cert_secret: str | None = None,
    checkpoint_dir: str | None = None,
) -> PodWiring:
    """The wiring of the pods of an operator with ``settings`` (its own bus settings:
    pods reach the same Kafka the same way unless told otherwise)."""
    protocol = settings.security_protocol
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
    values = [(f"{ENV_PREFIX}BOOTSTRAP_SERVERS", bootstrap_servers or settings.bootstrap_servers)]
    secrets: list[tuple[str, SecretKey]] = []
    volumes: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    if protocol != "PLAINTEXT":
        values.append((f"{ENV_PREFIX}SECURITY_PROTOCOL", protocol))
    if sasl:
        if not sasl_password_secret:
            raise UserError(
                f"{ENV_PREFIX}SECURITY_PROTOCOL={protocol}: training pods need the Kafka "
                f"password too; set {_OPT}POD_SASL_PASSWORD_SECRET=SECRET:KEY (a Secret in "
                "the jobs' namespace)"
            )
        user = sasl_username or settings.sasl_username
        values += [(f"{ENV_PREFIX}SASL_MECHANISM", str(settings.sasl_mechanism))]
        values += [(f"{ENV_PREFIX}SASL_USERNAME", str(user))]
        secrets.append(
            (
                f"{ENV_PREFIX}SASL_PASSWORD",
                SecretKey.parse(sasl_password_secret, f"{_OPT}POD_SASL_PASSWORD_SECRET"),
            )
        )
    else:
        _unused(sasl_password_secret or sasl_username, "POD_SASL_*", protocol)
    if tls:
        if ca_secret:
            volumes.append((CA_VOLUME, ca_secret, CA_DIR))
            values.append((f"{ENV_PREFIX}SSL_CAFILE", _file(CA_DIR, settings.ssl_cafile, "ca.crt")))
        elif settings.ssl_cafile:
            warnings.append(
                f"the operator trusts the CA in {settings.ssl_cafile} but its training pods get"
                f" none (they trust their image's CAs); set {_OPT}POD_KAFKA_CA_SECRET"
            )
        if cert_secret:
            volumes.append((CERT_VOLUME, cert_secret, CERT_DIR))
            values += [
                (f"{ENV_PREFIX}SSL_CERTFILE", _file(CERT_DIR, settings.ssl_certfile, "tls.crt")),
                (f"{ENV_PREFIX}SSL_KEYFILE", _file(CERT_DIR, settings.ssl_keyfile, "tls.key")),
            ]
        elif settings.ssl_certfile:
            raise UserError(
                f"the operator authenticates to Kafka with a client certificate; its training"
                f" pods need one too: set {_OPT}POD_KAFKA_CERT_SECRET (a Secret in the jobs'"
                " namespace)"
            )
        if settings.ssl_key_password is not None:
            warnings.append("training pods get no SSL key password: give them an unencrypted key")
        if not settings.ssl_check_hostname:
            values.append((f"{ENV_PREFIX}SSL_CHECK_HOSTNAME", "false"))
    else:
        _unused(ca_secret or cert_secret, "POD_KAFKA_*_SECRET", protocol)
    if checkpoint_dir:
        # the SDK's default root (`<dir>/<job>.pt`), as the local and hosts platforms give
        values.append((CHECKPOINT_DIR_ENV, checkpoint_dir))
    if gateway_url:
        values.append((URL_ENV, gateway_url))
    else:
        warnings.append(
            f"training pods get no gateway (their plans and configs): set {_OPT}GATEWAY_URL"
            " to the gateway Service's address"
        )
    return PodWiring(
        values=tuple(values),
        secrets=tuple(secrets),
        token_secret=token_secret if gateway_url else None,
        volumes=tuple(volumes),
        warnings=tuple(warnings),
    )


def _unused(given: object, setting: str, protocol: str) -> None:
    if given:
        raise UserError(
            f"{_OPT}{setting} is set but {ENV_PREFIX}SECURITY_PROTOCOL={protocol} does not use it"
        )


__all__ = ["CA_DIR", "CERT_DIR", "PodWiring", "SecretKey", "pod_wiring"]
