"""Evaluation reports: an evaluator's KPIs for one env over one window."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field, model_validator

from schemas.envelope import Event


class EvaluationReport(Event):
    topic: ClassVar[str] = "eval.reports"
    type: Literal["eval.report"] = "eval.report"
    evaluator: str = Field(min_length=1)
    window_start: AwareDatetime
    window_end: AwareDatetime
    jobs: int = Field(default=0, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _window(self) -> EvaluationReport:
        if self.window_end < self.window_start:
            raise ValueError("window_end is before window_start")
        if self.key is None:
            self.key = self.evaluator
        return self
