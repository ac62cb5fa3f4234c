"""Cutting runtime samples: the step records of one interval become one ``RuntimeSample``.

Runs in the reporter's thread, never in training's: the training thread only appends
records to the deque this reads.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from pydantic import ValidationError

from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.probes import Probe
from dlrover_events.sdk.window import GradStatsWindow, SplitWindow, StepRecord, StepWindow
from schemas.jobs import NodeUsage, RuntimeSample

log = logging.getLogger("dlrover_events.sdk.reporter")


class SampleCutter:
    """The window being measured (first and last step records seen), cut on demand."""

    def __init__(
        self,
        steps: deque[StepRecord],
        probes: list[Probe],
        grads: deque[tuple[float, float]] | None = None,
        splits: deque[tuple[float, float]] | None = None,
    ) -> None:
        self._steps = steps
        #: (grad_sqr, grad_var) estimates and (compute_s, allreduce_s) of timed steps,
        #: appended by the training thread now and then (see ``Reporter.observe_*``).
        self._grads: deque[tuple[float, float]] = grads if grads is not None else deque()
        self._splits: deque[tuple[float, float]] = splits if splits is not None else deque()
        #: resource probes, read at each cut; one that raises is disabled.
        self.probes = probes
        self.window = StepWindow()
        self.grad_window = GradStatsWindow()
        self.split_window = SplitWindow()
        #: samples made so far.
        self.made = 0

    def drain(self) -> None:
        """Fold the records appended since the last call into the window."""
        steps, add = self._steps, self.window.add
        while steps:
            add(steps.popleft())
        grads, splits = self._grads, self._splits
        while grads:
            self.grad_window.add(*grads.popleft())
        while splits:
            self.split_window.add(*splits.popleft())

    def cut(
        self,
        ident: JobIdentity,
        batch_size: int | None,
        batch: tuple[int | None, int],
    ) -> RuntimeSample | None:
        """The sample of the steps since the last cut; None if there were none.

        ``batch`` is (local_batch_size, accumulation_steps), read as one tuple so a switch
        of both knobs is never seen half made.
        """
        window = self.window.cut()
        if window is None:
            return None
        grads = self.grad_window.cut()
        split = self.split_window.cut()
        speed = window.speed
        local_batch_size, accumulation_steps = batch
        if batch_size is not None:
            samples_per_s = speed * batch_size
        elif window.samples_per_step is not None:
            samples_per_s = window.samples_per_step * speed * ident.world_size
        elif local_batch_size is not None:
            samples_per_s = local_batch_size * accumulation_steps * speed * ident.world_size
        else:
            samples_per_s = 0.0
        try:
            sample = RuntimeSample(
                env=ident.env,
                job=ident.job,
                source=ident.source,
                global_step=window.global_step,
                speed=speed,
                samples_per_s=samples_per_s,
                batch_size=batch_size,
                local_batch_size=local_batch_size,
                accumulation_steps=accumulation_steps,
                world_size=ident.world_size,
                nodes=[self._usage(ident, window.step_time)],
                num_nodes=ident.num_nodes,
                grad_sqr=grads[0] if grads else None,
                grad_var=grads[1] if grads else None,
                compute_s=split[0] if split else None,
                allreduce_s=split[1] if split else None,
            )
        except ValidationError as err:
            log.warning("dlrover-events: cannot build a runtime sample: %s", err)
            return None
        self.made += 1
        return sample

    def _usage(self, ident: JobIdentity, step_time: float) -> NodeUsage:
        fields: dict[str, Any] = {}
        for probe in list(self.probes):
            try:
                fields.update(probe())
            except Exception as err:
                self.probes.remove(probe)
                log.warning("dlrover-events: resource probe %r failed, disabled: %s", probe, err)
        base = {"type": ident.role, "id": ident.rank, "step_time": step_time}
        try:
            return NodeUsage(**base, **fields)
        except ValidationError as err:
            log.warning("dlrover-events: resource probes gave invalid values: %s", err)
            return NodeUsage(**base)
