"""The training-side SDK: a job reports its progress and resource use to the bus.

    from dlrover_events.sdk import Reporter

    with Reporter.from_env(batch_size=256) as reporter:
        for batch in loader:
            train_step(batch)
            reporter.step()

It never blocks a step and never raises into training when the bus is down: it buffers
(bounded), counts what it drops and says so. The torch hook (``dlrover_events.sdk.torch``)
adds GPU memory and OOM events; importing this package does not import torch.

A job following the brain's plans adds ``PlanFollower`` (its plan from the gateway) and
``StepKnobs`` (local batch size and accumulation switched at a step boundary); an elastic
torch job adds ``dlrover_events.sdk.torch.ElasticCheckpoint``.

A job started on the real env follows the real env through ``dlrover-events env promote``
(``FollowReal``, ``DLROVER_EVENTS_FOLLOW_REAL``); aiokafka's own log lines from the
reporter's thread stay out of the training log (``DLROVER_EVENTS_SDK_KAFKA_LOGS``).

A trial of an experiment adds ``Trial`` (its hyperparameters and budget, its metrics;
``dlrover_events.sdk.torch.TrialSync`` makes every rank agree on the budget).
"""

from dlrover_events.sdk.follow_plan import PlanFollower, PlanSnapshot
from dlrover_events.sdk.follow_real import FOLLOW_REAL_ENV, FollowReal
from dlrover_events.sdk.identity import (
    ENV_ENV,
    JOB_ID_ENV,
    RANK_ENV,
    ROLE_ENV,
    WORLD_SIZE_ENV,
    IdentityError,
    JobIdentity,
)
from dlrover_events.sdk.knobs import BatchKnobs, StepKnobs, Switch
from dlrover_events.sdk.probes import HostProbe, Probe, rss_bytes
from dlrover_events.sdk.quiet import KAFKA_LOGS_ENV
from dlrover_events.sdk.reporter import INTERVAL_ENV, Reporter, ReporterStats
from dlrover_events.sdk.trial import NotATrial, Trial, TrialError, TrialStatus

__all__ = [
    "ENV_ENV",
    "FOLLOW_REAL_ENV",
    "INTERVAL_ENV",
    "JOB_ID_ENV",
    "KAFKA_LOGS_ENV",
    "RANK_ENV",
    "ROLE_ENV",
    "WORLD_SIZE_ENV",
    "BatchKnobs",
    "FollowReal",
    "HostProbe",
    "IdentityError",
    "JobIdentity",
    "NotATrial",
    "PlanFollower",
    "PlanSnapshot",
    "Probe",
    "Reporter",
    "ReporterStats",
    "StepKnobs",
    "Switch",
    "Trial",
    "TrialError",
    "TrialStatus",
    "rss_bytes",
]
