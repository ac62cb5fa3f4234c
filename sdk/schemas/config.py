"""Configuration documents (Include / Exclude / Configure) and their change events.

The JSON keys are DLRover's capitalised ``Include``, ``Exclude`` and ``Configure``; Python
code uses the lowercase attribute names.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field, model_validator

from schemas.bounds import Document
from schemas.envelope import Event, Model

Scalar = str | int | float | bool
#: A condition's value: one value, or a list meaning "any of".
ConditionValue = Scalar | list[Scalar]


class ConfigDocument(Model):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    include: dict[str, ConditionValue] = Field(default_factory=dict, alias="Include")
    exclude: dict[str, ConditionValue] = Field(default_factory=dict, alias="Exclude")
    configure: Document = Field(default_factory=dict, alias="Configure")
    priority: int = Field(default=0, description="breaks ties between equally specific docs")
    version: int = Field(default=1, ge=1, description="optimistic-concurrency version")
    updated_at: AwareDatetime | None = None


class ConfigChange(Event):
    """A document created, updated or deleted; keyed by document name on a compacted topic."""

    topic: ClassVar[str] = "config.changes"
    type: Literal["config.change"] = "config.change"
    op: Literal["upsert", "delete"]
    name: str = Field(min_length=1, max_length=200)
    version: int = Field(ge=1)
    document: ConfigDocument | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ConfigChange:
        if self.op == "upsert" and self.document is None:
            raise ValueError("an upsert carries the document")
        if self.document is not None and self.document.name != self.name:
            raise ValueError("document name must equal the change's name")
        if self.key is None:
            self.key = self.name
        return self
