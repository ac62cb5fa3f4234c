"""The job's identity from the environment the operator sets."""

from __future__ import annotations

import pytest

from dlrover_events.sdk.identity import (
    ENV_ENV,
    JOB_ID_ENV,
    LABELS_ENV,
    RANK_ENV,
    ROLE_ENV,
    IdentityError,
    JobIdentity,
)


def test_operator_variables_make_the_identity() -> None:
    ident = JobIdentity.from_env(
        {
            JOB_ID_ENV: "job-7",
            ROLE_ENV: "ps",
            RANK_ENV: "3",
            ENV_ENV: "shadow-a",
            "DLROVER_EVENTS_USER": "alice",
            LABELS_ENV: "team=vision, tier=gold",
            "DLROVER_EVENTS_WORLD_SIZE": "8",
        }
    )
    assert ident.job.uuid == "job-7"
    assert (ident.role, ident.rank, ident.env, ident.world_size) == ("ps", 3, "shadow-a", 8)
    assert ident.node.type == "ps" and ident.node.id == 3
    assert ident.job.labels == {"team": "vision", "tier": "gold"}
    attrs = ident.attributes()
    assert attrs["job"] == "job-7" and attrs["user"] == "alice" and attrs["rank"] == "3"
    assert attrs["labels.team"] == "vision"
    assert "cluster" not in attrs  # empty attributes are not sent: they would match nothing


def test_defaults_and_launcher_fallbacks() -> None:
    ident = JobIdentity.from_env({JOB_ID_ENV: "j", "RANK": "5", "WORLD_SIZE": "6"})
    assert (ident.role, ident.rank, ident.world_size, ident.env) == ("worker", 5, 6, "prod")
    # The operator's variable wins over the launcher's.
    assert JobIdentity.from_env({JOB_ID_ENV: "j", "RANK": "5", RANK_ENV: "1"}).rank == 1


def test_explicit_job_id_overrides_the_environment() -> None:
    assert JobIdentity.from_env({}, job_id="given").job.uuid == "given"


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, JOB_ID_ENV),
        ({JOB_ID_ENV: "j", RANK_ENV: "two"}, RANK_ENV),
        ({JOB_ID_ENV: "j", RANK_ENV: "-1"}, RANK_ENV),
        ({JOB_ID_ENV: "j", ENV_ENV: "Prod!"}, ENV_ENV),
        ({JOB_ID_ENV: "j", LABELS_ENV: "novalue"}, LABELS_ENV),
    ],
)
def test_mistakes_name_the_variable(environ: dict[str, str], names: str) -> None:
    with pytest.raises(IdentityError, match=names):
        JobIdentity.from_env(environ)
