"""The envelope every event carries.

Events are flat: envelope fields and the event's own fields side by side, with ``type``
as the discriminator. A flat object is what a producer in any language writes most
easily, and one discriminated union decodes any event in a single pass.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, ClassVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from schemas.bounds import Text

#: Highest envelope/schema version this code understands. A consumer rejects (to the
#: DLQ) events from a newer producer instead of guessing at fields it does not know.
SCHEMA_VERSION = 1

ENV_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,30}$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


def _check_env(name: str) -> str:
    if not _ENV_NAME.match(name):
        raise ValueError(
            f"env name {name!r} must match {ENV_NAME_PATTERN} "
            "(lowercase letter, then up to 30 lowercase letters, digits or '-')"
        )
    return name


EnvName = Annotated[str, AfterValidator(_check_env)]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Model(BaseModel):
    """Base of every contract model: strict about unknown fields, so typos are caught, and
    about numbers: NaN and infinities are refused (JSON has no such numbers: encoders write
    them as null, which the next reader refuses)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class Event(Model):
    """Envelope fields shared by every event on the bus."""

    #: Topic suffix (``<env>.<topic>``) an event of this class is published to.
    topic: ClassVar[str] = ""

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    type: str
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    env: EnvName
    occurred_at: AwareDatetime = Field(default_factory=utcnow)
    source: Text = Field(default="", max_length=256, description="Who produced the event")
    key: Text | None = Field(
        default=None,
        max_length=512,
        description="Partition key: the job id for job topics, so one job stays in order",
    )
