"""The brain process's own settings (DLROVER_EVENTS_BRAIN_*): how this process runs,
not how the env decides (that is `schemas.env_settings.BrainSettings`, the env's)."""

from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.settings import SettingsError, settings_error
from streams.brain.core.inputs import DEFAULT_SAMPLE_DECODE, SampleDecode

PREFIX = "DLROVER_EVENTS_BRAIN_"


class BrainProcessSettings(BaseSettings):
    """A brain's process settings, read when a brain starts."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    sample_decode: SampleDecode = Field(
        default=DEFAULT_SAMPLE_DECODE,
        description="how runtime samples are read: fast (msgspec structs, pydantic for "
        "what they do not take) or pydantic (the contract's models alone; same states "
        "and plans, slower: to check the fast way against)",
    )


def load_brain_settings() -> BrainProcessSettings:
    """The settings from the environment; a bad value is a SettingsError (one line)."""
    try:
        return BrainProcessSettings()
    except ValidationError as err:
        raise settings_error(err, PREFIX) from None


__all__ = ["PREFIX", "BrainProcessSettings", "SettingsError", "load_brain_settings"]
