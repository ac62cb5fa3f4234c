"""In-place elastic training (extra ``torch``): a resize without restarting the processes.

torchrun's elastic agent restarts every worker when the world changes: each imports torch
again, builds its model and loads the checkpoint, seconds of a whole job not training. An
``InPlaceGroup`` keeps the processes instead. At a step boundary the members agree on the
next membership, destroy their process group and create the next one (a new prefix of the
job's store, ``init_process_group``), rebuild DDP, and newcomers receive the model and
optimizer state from a member by broadcast (no checkpoint file on the way):

- a removed pod's process gets SIGTERM: it asks to leave, and goes once the others agreed
  without it (``left``: the loop ends, the process exits 0);
- a newcomer (a new pod, a warm spare the platform admits) registers in the store; rank 0
  sees it at the next boundary and the members take it in;
- a member lost mid-step (SIGKILL, a dead machine) fails the collectives of the others at
  once (gloo: the peer's connection closes) or at the group's timeout: the survivors
  register in the store, one of them decides the next generation without the lost one,
  and they go on from the state of the survivor that completed the most steps;
- when re-forming fails (the store is gone: its host died), ``ReformFailed`` is raised:
  the process exits non-zero, its torchrun agent starts it again, and the new processes
  form the job again from the checkpoint. The first generation formed so reports
  ``training.rescaled`` with mode ``restart``.

The decisions are pure (``dlrover_events.sdk.membership``); this is the torch shell, cut
by role: ``inplace_settings`` (what the platform says, ``InPlaceSettings``),
``inplace_store`` (the protocol's records in the job's store), ``inplace_ddp`` (the process
group and DDP of a generation) and ``inplace_state`` (the state broadcast); the group here
keeps the loop's side (the step, leaving, rescales and their reports). The training knobs
switch at the same boundary (``StepKnobs.resize`` keeps the global batch, then a plan's
knobs are decided at once). Rank 0 reports each rescale with its phases.

    group = InPlaceGroup.from_env(reporter=reporter, knobs=knobs)
    group.join(model, optimizer, checkpoint=ckpt)
    while group.step < steps:
        group.boundary()
        if group.left:
            break
        with group.stepping():
            train_step(group.model, optimizer, group.step)
        with group.surviving():
            ckpt.maybe_save(group.step)

The job's store (``DLROVER_EVENTS_ELASTIC_STORE``) is a ``TCPStore`` hosted by the role's
rendezvous host process (its pod rank 0, which a scale-down never removes). State travels
through the process group: right for models of up to a few GB per broadcast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from dlrover_events.sdk.identity import ELASTIC_ADMIT_ENV, ELASTIC_STORE_ENV, RANK_ENV
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.membership import (
    FROM_CHECKPOINT,
    Check,
    Decision,
    Rescale,
    check_vector,
    gather_wait,
    plan_for,
    read_check,
)
from dlrover_events.sdk.probes import process_started_at
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.torch import ElasticCheckpoint, is_peer_failure, knob_sync
from dlrover_events.sdk.torch.exiting import weak_handler
from dlrover_events.sdk.torch.inplace_ddp import GenerationGroup
from dlrover_events.sdk.torch.inplace_settings import (
    DEFAULT_GATHER_S,
    DEFAULT_SETTLE_S,
    DEFAULT_TIMEOUT_S,
    GATHER_ENV,
    OVERRIDABLE,
    SETTLE_ENV,
    TIMEOUT_ENV,
    InPlaceSettings,
)
from dlrover_events.sdk.torch.inplace_state import StateSync
from dlrover_events.sdk.torch.inplace_store import (
    CONNECT_S,
    POLL_S,
    MembershipStore,
    ReformFailed,
    first_line,
)
from schemas.plans import RescaleMode, ScalePlan, TrainingRescaled

log = logging.getLogger(__name__)


def wait_admitted(path: str | os.PathLike[str] | None = None, *, poll_s: float = POLL_S) -> bool:
    """A warm spare waits here (torch imported, model built) until the platform admits it:
    the file ``path`` (default: $DLROVER_EVENTS_ELASTIC_ADMIT) appears with the pod's
    variables, which this process takes on. An empty file is not an admission yet: on
    Kubernetes the file is a downward-API view of the pod's admission annotation, which
    the kubelet writes empty while it is unset. True when admitted (or not a spare), False
    when told to stop first (SIGTERM: the spare is not needed any more)."""
    raw = path if path is not None else os.environ.get(ELASTIC_ADMIT_ENV)
    if not raw:
        return True
    file = Path(raw)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                text = file.read_text().strip()
                # empty: not yet (on Kubernetes, the annotation is unset); half a JSON
                # document: being written, look again
                admission = json.loads(text) if text else None
            except (FileNotFoundError, ValueError):
                admission = None
            if admission is not None:
                os.environ.update({str(k): str(v) for k, v in admission["env"].items()})
                os.environ.pop(ELASTIC_ADMIT_ENV, None)
                log.info("admitted as %s", admission.get("pod", "a pod"))
                return True
            stop.wait(poll_s)
        return False
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class InPlaceGroup:
    """This process's membership of an in-place elastic job (see the module). Its parts by
    role: ``settings`` (what the platform said), the membership store (the protocol's
    records, ``inplace_store``), the process group and DDP (``inplace_ddp``) and the state
    broadcast (``inplace_state``); the group keeps the loop's side: the step, leaving, the
    rescales and their reports."""

    def __init__(
        self,
        settings: InPlaceSettings,
        *,
        member: str | None = None,
        reporter: Reporter | None = None,
        knobs: StepKnobs | None = None,
        plan: Callable[[], ScalePlan | None] | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
        on_rescaled: Callable[[Rescale], object] | None = None,
        handle_sigterm: bool = True,
    ) -> None:
        self.settings = settings
        self._member = member
        self.reporter = reporter
        self.knobs = knobs
        self.plan = plan
        self.on_rescaled = on_rescaled
        self._store = MembershipStore(settings)
        self._group = GenerationGroup(settings.backend, settings.timeout_s, ddp_kwargs)
        #: steps done: the loop trains step ``step + 1`` next
        self.step = 0
        self.left = False
        self.rescales: list[Rescale] = []
        self._decision: Decision | None = None
        self._rank = 0
        self._module: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._checkpoint: ElasticCheckpoint | None = None
        self._leave_at: float | None = None
        #: when the current generation was agreed (a plan after it is the next change's)
        self._formed_at = 0.0
        self._pending: Rescale | None = None
        self._previous_handler: Any = None
        if handle_sigterm:
            self.install_sigterm_handler()

    @classmethod
    def from_env(cls, **kwargs: Any) -> InPlaceGroup | None:
        """The group the platform set up for this process, None when it is not in-place
        (no DLROVER_EVENTS_ELASTIC_STORE). Call it after ``wait_admitted``. ``kwargs``: the
        constructor's, and any ``InPlaceSettings`` field (but the store's address), which
        wins over the environment."""
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in OVERRIDABLE}
        settings = InPlaceSettings.from_env(**overrides)
        if settings is None:
            return None
        return cls(settings, **kwargs)

    # -- who we are ----------------------------------------------------------------------

    @property
    def role(self) -> str:
        return self.settings.role

    @property
    def backend(self) -> str:
        return self._group.backend

    @property
    def member(self) -> str:
        """This process as the store knows it: its pod's node rank, local rank and pid."""
        if self._member is None:
            node = os.environ.get(RANK_ENV, "?")
            local = os.environ.get("LOCAL_RANK", "0")
            self._member = f"{self.role}-{node}.{local}@{os.getpid()}"
        return self._member

    @property
    def rank(self) -> int:
        """This process's rank in its generation (the last one, once it left)."""
        return self._rank

    @property
    def world_size(self) -> int:
        return self._decision.world_size if self._decision is not None else 0

    @property
    def generation(self) -> int:
        return self._decision.generation if self._decision is not None else 0

    @property
    def model(self) -> torch.nn.Module:
        """The model to train this step (DDP around the module; rebuilt at each re-form:
        read it anew each step, do not keep it)."""
        if self._group.ddp is None:
            raise RuntimeError("join() first")
        return self._group.ddp

    @property
    def device(self) -> torch.device:
        return self._group.device

    # -- leaving -------------------------------------------------------------------------

    def request_leave(self) -> None:
        """Leave at the next boundary, once the others agreed (the loop then ends)."""
        if self._leave_at is None:
            self._leave_at = time.time()

    @property
    def leaving(self) -> bool:
        return self._leave_at is not None

    def install_sigterm_handler(self) -> bool:
        """SIGTERM (the pod removed) asks to leave; repeated ones too (the agent passes
        its own on): the platform's grace period ends a process that cannot."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGTERM will not make this rank leave")
            return False
        self._previous_handler = signal.signal(signal.SIGTERM, weak_handler(self._on_sigterm))
        return True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._leave_at is None:
            self._leave_at = time.time()

    # -- joining ---------------------------------------------------------------------------

    def join(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        checkpoint: ElasticCheckpoint | None = None,
    ) -> int:
        """Enter the job: register, wait to be admitted (the host forms the first
        generation), take the state; the step to train from. ``model`` is the plain
        module (the group wraps it in DDP)."""
        self._module, self._optimizer, self._checkpoint = model, optimizer, checkpoint
        try:
            self._store.connect()
        except Exception as err:
            raise ReformFailed(f"cannot reach the job's store: {first_line(err)}") from err
        try:
            self._admit_and_enter(time.time())
        except _Lost as lost:  # a member of the generation it joined did not come
            self.recover(lost.err, lost.decision)
        except RuntimeError as err:
            if isinstance(err, ReformFailed):
                raise
            # the store went away while this process waited (its host restarted)
            raise ReformFailed(f"joining failed: {first_line(err)}") from err
        return self.step

    def _admit_and_enter(self, since: float) -> None:
        store = self._store
        ticket = store.register(self.member)
        if self.settings.hosts_store and not store.first_formed():
            store.form_first()
        decision = store.await_admission(ticket, lambda: self.leaving)
        if decision is None:
            self.left = True
            return
        self._enter(decision, RescaleMode.IN_PLACE, boundary_at=since)

    # -- re-forming -------------------------------------------------------------------------

    def _enter(
        self,
        decision: Decision,
        mode: RescaleMode,
        *,
        boundary_at: float,
        agreed_at: float | None = None,
    ) -> None:
        """Become a member of ``decision``'s generation: group, state, DDP, knobs."""
        agreed_at = agreed_at or time.time()
        rank = decision.rank_of(self.member)
        assert rank is not None
        first = decision.source == FROM_CHECKPOINT
        restarted = first and decision.reason == "restart"
        if restarted:
            # the restart path: its phases count from this process's start (torch's import
            # and the wait for the others included); what the old processes had trained
            # since the checkpoint is not known here
            boundary_at = agreed_at = process_started_at() or boundary_at
        rescale = Rescale(
            mode=RescaleMode.RESTART if restarted else mode,
            generation=decision.generation,
            world_before=decision.world_before,
            world_size=decision.world_size,
            rank=rank,
            step=decision.step,
            reason=_reason(decision),
            joined=len(decision.joined),
            left=max((decision.world_before or 0) + len(decision.joined) - decision.world_size, 0),
            steps_lost=None if restarted else decision.steps_lost,
            sign_at=None if restarted else decision.sign_at,
            boundary_at=boundary_at,
            agreed_at=agreed_at,
        )
        self._group.teardown()
        self._store.verify()
        try:
            self._group.form(
                self._store.process_group_store(decision.generation), rank, decision.world_size
            )
        except Exception as err:
            raise _Lost(decision, err) from err
        self._decision, self._rank = decision, rank
        self._formed_at = agreed_at
        rescale.group_at = time.time()
        self.step = decision.step
        try:
            self._take_state(decision, rank, first)
            rescale.state_at = time.time()
            assert self._module is not None
            self._group.wrap(self._module)
            if self._optimizer is not None:
                self._optimizer.zero_grad(set_to_none=True)
            if self.knobs is not None:
                self.knobs.at_step_boundary(self.step, now=True)
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            raise _Lost(decision, err) from err
        if self.reporter is not None:
            self.reporter.set_world(decision.world_size, rank)
        rescale.ready_at = time.time()
        rescale.step = self.step
        self._pending = rescale
        log.info(
            "generation %d: rank %d of %d from step %d (%s)",
            decision.generation,
            rank,
            decision.world_size,
            self.step,
            rescale.reason,
        )

    def _take_state(self, decision: Decision, rank: int, first: bool) -> None:
        if self.knobs is not None:
            self.knobs.resize(
                decision.world_size,
                rank,
                knob_sync() if decision.world_size > 1 else None,
                self.step,
            )
        if first:
            if self._checkpoint is not None:
                self.step = self._checkpoint.restore()
            else:
                self._transfer(0)
        elif decision.joined or decision.reason == "peer lost":
            self._transfer(decision.source)

    def _transfer(self, src: int) -> None:
        """The source rank's model, optimizer, step and knobs to every member, and with a
        checkpoint its progress (``ElasticCheckpoint.progress``: the sampler's position
        too), taken as a restore takes it: a newcomer, a warm spare admitted among them,
        or a survivor behind by a step goes on from the same data position as the
        source."""
        assert self._module is not None
        me = dist.get_rank()
        ckpt = self._checkpoint
        state = None
        if me == src:
            state = {
                "model": self._module.state_dict(),
                "optimizer": self._optimizer.state_dict() if self._optimizer else None,
                "step": self.step,
                "knobs": self.knobs.state_dict() if self.knobs is not None else None,
                "progress": ckpt.progress(self.step) if ckpt is not None else None,
            }
        got = StateSync(self.device).broadcast(state, src)
        step = int(got["step"])
        if me != src:
            if ckpt is not None:
                ckpt.wait_staged()  # the copy of its last save must not see this state
            self._module.load_state_dict(got["model"])
            if self._optimizer is not None and got["optimizer"] is not None:
                self._optimizer.load_state_dict(got["optimizer"])
            if ckpt is not None and got.get("progress"):
                ckpt.take_progress(got["progress"], step)
            if (
                self.knobs is not None
                and got["knobs"] is not None
                and (ckpt is None or ckpt.knobs is not self.knobs)  # taken with the progress
            ):
                self.knobs.load_state_dict(got["knobs"], step)
        self.step = step

    # -- at each step boundary --------------------------------------------------------------

    def boundary(self) -> Rescale | None:
        """Before each step, on every member: re-form when a member leaves or a newcomer
        waits (a collective every ``check_every`` steps). The rescale made, or None."""
        if self.left or self._decision is None:
            return None
        if self.step % self.settings.check_every:
            # every member is at the same step here (a newcomer too: it takes the step
            # with the state), so all of them skip the same boundaries; a leaver waits for
            # the next check, since a collective it started alone would meet the others'
            return None
        decision = self._decision
        boundary_at = time.time()
        gather_s = self.settings.gather_s
        try:
            check = self._check(decision)
            if check.leaving and gather_s > 0:
                # every member saw the same leavers, so every member checks again: the
                # pods one plan removes then leave together
                wait = gather_wait(
                    check,
                    time.time(),
                    gather_s,
                    world_size=decision.world_size,
                    expected=self._planned_replicas(),
                )
                time.sleep(wait)
                check = self._check(decision)
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            return self.recover(err)
        if not check.changes(decision.admitted):
            return None
        return self._reform(decision, check, boundary_at)

    def _planned_replicas(self) -> int | None:
        """The role's replicas in the job's plan when it came after this generation was
        agreed (so it is the plan behind the change); None when not known."""
        plan = self.plan() if self.plan is not None else None
        if plan is None or plan.occurred_at.timestamp() <= self._formed_at:
            return None
        group = plan.node_group_resources.get(self.role)
        return None if group is None else group.count

    def _check(self, decision: Decision) -> Check:
        rank, world = self.rank, decision.world_size
        newest, sign = 0, self._leave_at
        if rank == 0:
            newest, waiting = self._store.waiting(decision.admitted)
            times = [j.registered_at for j in waiting]
            if sign is not None:
                times.append(sign)
            sign = min(times, default=None)
        vector = torch.tensor(
            check_vector(world, rank, leaving=self.leaving, newest_ticket=newest, sign_at=sign),
            dtype=torch.int64,
            device=self.device,
        )
        if world > 1:
            dist.all_reduce(vector, op=dist.ReduceOp.MAX)
        return read_check([int(v) for v in vector.tolist()], world)

    def _reform(self, decision: Decision, check: Check, boundary_at: float) -> Rescale | None:
        if self.rank in check.leaving:
            # agreed: the others go on without this rank, which needs nothing more
            self._leave(decision)
            return None
        self._store.verify()
        staying = [r for r in range(decision.world_size) if r not in check.leaving]
        if staying and self.rank == staying[0]:
            self._store.propose(decision, check, self.step)
        try:
            nxt = self._store.agreed(decision.generation)
        except Exception as err:
            raise ReformFailed(f"no agreement in the job's store: {first_line(err)}") from err
        agreed_at = time.time()
        if nxt.rank_of(self.member) is None:
            self._leave(decision)
            return None
        try:
            self._enter(nxt, RescaleMode.IN_PLACE, boundary_at=boundary_at, agreed_at=agreed_at)
        except _Lost as lost:
            return self.recover(lost.err, lost.decision)
        if self._pending is not None:
            self.rescales.append(self._pending)
        return self._pending

    def _leave(self, decision: Decision) -> None:
        asked = "" if self._leave_at is None else f", asked at {self._leave_at:.3f}"
        log.info("left the job at step %d (generation %d%s)", self.step, decision.generation, asked)
        self.left = True
        self._group.teardown()

    # -- around each step -----------------------------------------------------------------

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Around one step: counts it when it completes; when a peer is lost in it, the
        group re-forms without the peer and the step is not counted (the loop does it
        again, with the state every member now shares)."""
        completed = False
        with self.surviving():
            yield
            completed = True
        if not completed:
            return
        self.step += 1
        pending = self._pending
        if pending is not None:
            self._pending = None
            pending.first_step_at = time.time()
            self._report(pending)
            if self.on_rescaled is not None:
                self.on_rescaled(pending)

    @contextlib.contextmanager
    def surviving(self) -> Iterator[None]:
        """Around a collective of the loop's own between steps, such as a checkpoint's
        ``maybe_save`` (its agreement is an all-reduce of every member): a peer lost in it
        is survived as one lost in a step, the group re-forming without it (ReformFailed
        when it cannot); the step count stays. Without it the error ended the process
        with a traceback (exit 1) where in-place survival, or the restart path's
        ``ReformFailed``, was due."""
        try:
            yield
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            self.recover(err)

    def recover(self, err: BaseException, decision: Decision | None = None) -> Rescale | None:
        """A peer was lost in ``decision``'s generation (default: the current one):
        re-form with the survivors (see the module). ReformFailed when it cannot."""
        decision = decision or self._decision
        if decision is None:
            raise ReformFailed(f"a peer was lost before any generation: {first_line(err)}")
        failed_at = time.time()
        log.warning(
            "a peer was lost at step %d of generation %d: %s",
            self.step + 1,
            decision.generation,
            first_line(err),
        )
        for _ in range(5):
            self._group.teardown()
            self._store.verify()
            try:
                nxt = self._store.survive(decision, self.member, self.step)
                if nxt.rank_of(self.member) is None:
                    log.warning("left out of generation %d: joining again", nxt.generation)
                    self._admit_and_enter(failed_at)
                else:
                    self._enter(
                        nxt,
                        RescaleMode.IN_PLACE,
                        boundary_at=failed_at,
                        agreed_at=time.time(),
                    )
            except _Lost as lost:
                decision = lost.decision
                continue
            except ReformFailed:
                raise
            except Exception as err2:
                raise ReformFailed(f"re-forming failed: {first_line(err2)}") from err2
            if self._pending is not None:
                self._pending.sign_at = self._pending.sign_at or failed_at
                self.rescales.append(self._pending)
            return self._pending
        raise ReformFailed("re-forming failed five times in a row")

    # -- reporting ----------------------------------------------------------------------------

    def _report(self, rescale: Rescale) -> None:
        if self.plan is not None and rescale.plan_id is None:
            with contextlib.suppress(Exception):
                found = plan_for(self.plan(), self.role, rescale.world_size)
                if found is not None and (rescale.sign_at or 0) >= found[1] - 1:
                    rescale.plan_id, rescale.published_at = found
        if self.reporter is None or rescale.rank != 0:
            return
        if rescale.world_before is None and rescale.mode is RescaleMode.IN_PLACE:
            return  # the job's first formation: no rescale
        publish_rescale(self.reporter, rescale)

    def close(self) -> None:
        """Leave the group (the end of training)."""
        self._group.teardown()
        if self._previous_handler is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None


def publish_rescale(reporter: Reporter, rescale: Rescale) -> bool:
    """``training.rescaled`` for ``rescale`` through ``reporter`` (rank 0 speaks for the
    job); False when it could not be made. Never raises: the rescale is made, its report
    must not fail the step."""
    ident = reporter.identity
    try:
        reporter.publish(
            TrainingRescaled(
                env=ident.env,
                job=ident.job,
                source=ident.source,
                mode=rescale.mode,
                plan_id=rescale.plan_id,
                node=ident.node,
                world_size_before=rescale.world_before,
                world_size=rescale.world_size,
                global_step=rescale.step + 1,
                steps_lost=rescale.steps_lost,
                reason=rescale.reason,
                phases=rescale.phases(),
            )
        )
    except Exception:
        log.exception("could not report the rescale to world size %d", rescale.world_size)
        return False
    return True


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the platform runs this process in place (DLROVER_EVENTS_ELASTIC_STORE)."""
    return bool((os.environ if environ is None else environ).get(ELASTIC_STORE_ENV, "").strip())


class _Lost(Exception):
    """A generation could not form (a member did not come): recover from it."""

    def __init__(self, decision: Decision, err: BaseException) -> None:
        super().__init__(str(err))
        self.decision = decision
        self.err = err


def _reason(decision: Decision) -> str:
    if decision.reason == "restart":
        return "formed again after in-place re-forming failed (restarted by torchrun)"
    if decision.reason == "formed":
        return "formed"
    if decision.reason == "peer lost":
        return "a peer was lost"
    parts = []
    if decision.joined:
        parts.append(f"{len(decision.joined)} joined")
    before = decision.world_before or 0
    gone = before + len(decision.joined) - decision.world_size
    if gone > 0:
        parts.append(f"{gone} left")
    return ", ".join(parts) or "re-formed"


__all__ = [
    "CONNECT_S",
    "DEFAULT_GATHER_S",
    "DEFAULT_SETTLE_S",
    "DEFAULT_TIMEOUT_S",
    "GATHER_ENV",
    "SETTLE_ENV",
    "TIMEOUT_ENV",
    "InPlaceGroup",
    "InPlaceSettings",
    "ReformFailed",
    "StateSync",
    "publish_rescale",
    "requested",
    "wait_admitted",
]
