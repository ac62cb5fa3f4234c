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

The decisions are pure (``dlrover_events.sdk.membership``); this is the torch shell. The
training knobs switch at the same boundary (``StepKnobs.resize`` keeps the global batch,
then a plan's knobs are decided at once). Rank 0 reports each rescale with its phases.

    group = InPlaceGroup.from_env(reporter=reporter, knobs=knobs)
    group.join(model, optimizer, checkpoint=ckpt)
    while group.step < steps:
        group.boundary()
        if group.left:
            break
        with group.stepping():
            train_step(group.model, optimizer, group.step)

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
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrover_events.sdk.identity import (
    ELASTIC_ADMIT_ENV,
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    RANK_ENV,
    ROLE_ENV,
)
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.membership import (
    FROM_CHECKPOINT,
    Check,
    Decision,
    Joiner,
    Rescale,
    Survivor,
    check_vector,
    first_generation,
    gather_wait,
    plan_for,
    planned,
    read_check,
    recovered,
)
from dlrover_events.sdk.probes import process_started_at
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.torch import ElasticCheckpoint, is_peer_failure, knob_sync
from schemas.plans import RescaleMode, ScalePlan, TrainingRescaled

log = logging.getLogger(__name__)

#: Seconds a first generation waits for the members it expects before it forms with those
#: that came (the others join it in place).
SETTLE_ENV = "DLROVER_EVENTS_ELASTIC_SETTLE_S"
#: Seconds a collective, a group's formation or a read of the store may take: a member
#: lost without closing its connections is noticed after this long.
TIMEOUT_ENV = "DLROVER_EVENTS_ELASTIC_TIMEOUT_S"
#: Seconds after the first SIGTERM of a resize within which every member that gets one
#: leaves in the same generation (``membership.gather_wait``). The same for every member
#: of a role: whether to take the check again is decided from the agreed check.
GATHER_ENV = "DLROVER_EVENTS_ELASTIC_GATHER_S"
DEFAULT_SETTLE_S = 30.0
DEFAULT_GATHER_S = 0.1
DEFAULT_TIMEOUT_S = 60.0
#: Seconds a newcomer waits for the store's host to come up (it may still import torch).
CONNECT_S = 300.0
#: How often a waiting process looks at the store or at its admission file.
POLL_S = 0.02


class ReformFailed(RuntimeError):
    """The group could not be re-formed in place: exit non-zero, the agent restarts it."""


class StateSync:
    """A nested state (dicts, lists, tuples of tensors and plain values) from one rank to
    every rank of the group: its shape pickled once (``broadcast_object_list``), its
    tensors in one flat ``broadcast`` per dtype on the group's device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def broadcast(self, state: Any, src: int) -> Any:
        me = dist.get_rank()
        tensors: list[torch.Tensor] = []
        shape = _strip(state, tensors) if me == src else None
        box: list[Any] = [shape]
        dist.broadcast_object_list(box, src, device=self.device)
        shape = box[0]
        specs: list[tuple[int, torch.Size, torch.dtype, str]] = []
        _specs(shape, specs)
        out: dict[int, torch.Tensor] = {}
        by_dtype: dict[torch.dtype, list[tuple[int, torch.Size, torch.dtype, str]]] = {}
        for spec in specs:
            by_dtype.setdefault(spec[2], []).append(spec)
        for dtype, group in by_dtype.items():
            total = sum(int(torch.Size(s[1]).numel()) for s in group)
            if me == src:
                flat = torch.cat(
                    [tensors[s[0]].detach().reshape(-1).to(self.device) for s in group]
                )
            else:
                flat = torch.empty(total, dtype=dtype, device=self.device)
            dist.broadcast(flat, src)
            offset = 0
            for index, size, _, device_type in group:
                n = int(torch.Size(size).numel())
                t = flat[offset : offset + n].view(size).clone()
                out[index] = t.cpu() if device_type == "cpu" else t
                offset += n
        return _fill(shape, out)


class _TensorSpec:
    __slots__ = ("device_type", "dtype", "index", "size")

    def __init__(self, index: int, t: torch.Tensor) -> None:
        self.index = index
        self.size = tuple(t.shape)
        self.dtype = t.dtype
        self.device_type = t.device.type


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSpec(len(tensors) - 1, obj)
    if isinstance(obj, Mapping):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip(v, tensors) for v in obj)
    return obj


def _specs(obj: Any, out: list[tuple[int, torch.Size, torch.dtype, str]]) -> None:
    if isinstance(obj, _TensorSpec):
        out.append((obj.index, torch.Size(obj.size), obj.dtype, obj.device_type))
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _specs(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _specs(v, out)


def _fill(obj: Any, tensors: Mapping[int, torch.Tensor]) -> Any:
    if isinstance(obj, _TensorSpec):
        return tensors[obj.index]
    if isinstance(obj, Mapping):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill(v, tensors) for v in obj)
    return obj


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
    """This process's membership of an in-place elastic job (see the module)."""

    def __init__(
        self,
        store_host: str,
        store_port: int,
        *,
        hosts_store: bool,
        member: str | None = None,
        role: str = "worker",
        backend: str | None = None,
        expect: int = 1,
        settle_s: float = DEFAULT_SETTLE_S,
        gather_s: float = DEFAULT_GATHER_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        check_every: int = 1,
        recover_window_s: float = 1.0,
        reporter: Reporter | None = None,
        knobs: StepKnobs | None = None,
        plan: Callable[[], ScalePlan | None] | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
        on_rescaled: Callable[[Rescale], object] | None = None,
        handle_sigterm: bool = True,
    ) -> None:
        if check_every < 1 or expect < 1 or timeout_s <= 0 or gather_s < 0:
            raise ValueError("check_every and expect must be >= 1, timeout_s > 0, gather_s >= 0")
        self.store_host, self.store_port = store_host, store_port
        self.hosts_store = hosts_store
        self._member = member
        self.role = role
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.expect = expect
        self.settle_s = settle_s
        self.gather_s = gather_s
        self.timeout_s = timeout_s
        self.check_every = check_every
        self.recover_window_s = recover_window_s
        self.reporter = reporter
        self.knobs = knobs
        self.plan = plan
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.on_rescaled = on_rescaled
        #: steps done: the loop trains step ``step + 1`` next
        self.step = 0
        self.left = False
        self.rescales: list[Rescale] = []
        self._store: dist.TCPStore | None = None
        self._epoch = ""
        self._decision: Decision | None = None
        self._rank = 0
        self._module: torch.nn.Module | None = None
        self._ddp: torch.nn.Module | None = None
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
        (no DLROVER_EVENTS_ELASTIC_STORE). Call it after ``wait_admitted``."""
        addr = os.environ.get(ELASTIC_STORE_ENV, "").strip()
        if not addr:
            return None
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{ELASTIC_STORE_ENV} must be host:port, got {addr!r}")
        kwargs.setdefault("hosts_store", os.environ.get(ELASTIC_STORE_HOST_ENV) == "1")
        kwargs.setdefault("expect", int(os.environ.get(ELASTIC_EXPECT_ENV) or 1))
        kwargs.setdefault("settle_s", float(os.environ.get(SETTLE_ENV) or DEFAULT_SETTLE_S))
        kwargs.setdefault("gather_s", float(os.environ.get(GATHER_ENV) or DEFAULT_GATHER_S))
        kwargs.setdefault("timeout_s", float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S))
        kwargs.setdefault("role", os.environ.get(ROLE_ENV) or "worker")
        return cls(host, int(port), **kwargs)

    # -- who we are ----------------------------------------------------------------------

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
        if self._ddp is None:
            raise RuntimeError("join() first")
        return self._ddp

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

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
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        return True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._leave_at is None:
            self._leave_at = time.time()

    # -- the store -------------------------------------------------------------------------

    def _connect(self) -> dist.TCPStore:
        if self._store is None:
            store = dist.TCPStore(
                self.store_host,
                self.store_port,
                is_master=self.hosts_store,
                wait_for_workers=False,
                timeout=timedelta(seconds=CONNECT_S),
            )
            store.set_timeout(timedelta(seconds=self.timeout_s))
            if self.hosts_store:
                store.set("epoch", uuid.uuid4().hex)
            else:
                store.wait(["epoch"], timedelta(seconds=CONNECT_S))
            self._epoch = store.get("epoch").decode()
            self._store = store
        return self._store

    def _same_store(self) -> dist.TCPStore:
        """The store, checked to be the one this group formed in (its host restarted
        would be a new, empty store on the same port)."""
        store = self._store
        if store is None:
            raise ReformFailed("no store")
        try:
            epoch = store.get("epoch").decode()
        except Exception as err:
            raise ReformFailed(f"the job's store is gone: {_first_line(err)}") from err
        if epoch != self._epoch:
            raise ReformFailed("the job's store was started again (its host restarted)")
        return store

    def _register(self, store: dist.TCPStore) -> int:
        ticket = int(store.add("joiners", 1))
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        record = Joiner(ticket, self.member, time.time(), os.getpid(), restarts)
        store.set(f"joiner/{ticket}", record.encode())
        return ticket

    def _joiners(self, store: dist.TCPStore, after: int, upto: int) -> list[Joiner]:
        out = []
        for ticket in range(after + 1, upto + 1):
            if store.check([f"joiner/{ticket}/withdrawn"]):
                continue
            store.wait([f"joiner/{ticket}"])
            out.append(Joiner.decode(store.get(f"joiner/{ticket}")))
        return out

    def _decide(self, store: dist.TCPStore, key: str, decision: Decision) -> Decision:
        """Write ``decision`` at ``key`` unless another is there: the first one wins."""
        won = store.compare_set(key, "", decision.encode())
        return Decision.decode(won)

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
            store = self._connect()
        except Exception as err:
            raise ReformFailed(f"cannot reach the job's store: {_first_line(err)}") from err
        try:
            self._admit_and_enter(store, time.time())
        except _Lost as lost:  # a member of the generation it joined did not come
            self.recover(lost.err, lost.decision)
        except RuntimeError as err:
            if isinstance(err, ReformFailed):
                raise
            # the store went away while this process waited (its host restarted)
            raise ReformFailed(f"joining failed: {_first_line(err)}") from err
        return self.step

    def _admit_and_enter(self, store: dist.TCPStore, since: float) -> None:
        ticket = self._register(store)
        if self.hosts_store and not store.check(["gen/0/next"]):
            self._form_first(store)
        decision = self._await_admission(store, ticket)
        if decision is None:
            self.left = True
            return
        self._enter(decision, RescaleMode.IN_PLACE, boundary_at=since)

    def _form_first(self, store: dist.TCPStore) -> None:
        deadline = time.monotonic() + self.settle_s
        while int(store.add("joiners", 0)) < self.expect and time.monotonic() < deadline:
            time.sleep(POLL_S)
        joiners = self._joiners(store, 0, int(store.add("joiners", 0)))
        decision = self._decide(store, "gen/0/next", first_generation(joiners))
        for j in joiners:
            store.set(f"admit/{j.ticket}", decision.encode())
        store.set("gen", str(decision.generation))

    def _await_admission(self, store: dist.TCPStore, ticket: int) -> Decision | None:
        key = f"admit/{ticket}"
        said = time.monotonic()
        while not store.check([key]):
            if self.leaving:
                store.set(f"joiner/{ticket}/withdrawn", "1")
                if not store.check([key]):
                    log.info("told to stop before being admitted: leaving")
                    return None
                break  # admitted meanwhile: join, and leave at the first boundary
            if time.monotonic() - said > 30:
                said = time.monotonic()
                log.info("waiting to be admitted to the job (ticket %d)", ticket)
            time.sleep(POLL_S)
        return Decision.decode(store.get(key))

    # -- re-forming -------------------------------------------------------------------------

    def _teardown(self) -> None:
        self._ddp = None
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

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
        self._teardown()
        store = self._same_store()
        try:
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(f"gen/{decision.generation}/pg", store),
                rank=rank,
                world_size=decision.world_size,
                timeout=timedelta(seconds=self.timeout_s),
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
            self._ddp = DistributedDataParallel(self._module, init_sync=False, **self._ddp_args())
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

    def _ddp_args(self) -> dict[str, Any]:
        args = dict(self.ddp_kwargs)
        if self.backend == "nccl":
            args.setdefault("device_ids", [self.device.index])
        return args

    def _transfer(self, src: int) -> None:
        """The source rank's model, optimizer, step and knobs to every member."""
        assert self._module is not None
        me = dist.get_rank()
        state = None
        if me == src:
            state = {
                "model": self._module.state_dict(),
                "optimizer": self._optimizer.state_dict() if self._optimizer else None,
                "step": self.step,
                "knobs": self.knobs.state_dict() if self.knobs is not None else None,
            }
        got = StateSync(self.device).broadcast(state, src)
        if me != src:
            self._module.load_state_dict(got["model"])
            if self._optimizer is not None and got["optimizer"] is not None:
                self._optimizer.load_state_dict(got["optimizer"])
            if self.knobs is not None and got["knobs"] is not None:
                self.knobs.load_state_dict(got["knobs"], int(got["step"]))
        self.step = int(got["step"])

    # -- at each step boundary --------------------------------------------------------------

    def boundary(self) -> Rescale | None:
        """Before each step, on every member: re-form when a member leaves or a newcomer
        waits (a collective every ``check_every`` steps). The rescale made, or None."""
        if self.left or self._decision is None:
            return None
        if self.step % self.check_every:
            # every member is at the same step here (a newcomer too: it takes the step
            # with the state), so all of them skip the same boundaries; a leaver waits for
            # the next check, since a collective it started alone would meet the others'
            return None
        decision = self._decision
        boundary_at = time.time()
        try:
            check = self._check(decision)
            if check.leaving and self.gather_s > 0:
                # every member saw the same leavers, so every member checks again: the
                # pods one plan removes then leave together
                wait = gather_wait(
                    check,
                    time.time(),
                    self.gather_s,
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
        store = self._store
        assert store is not None
        rank, world = self.rank, decision.world_size
        newest, sign = 0, self._leave_at
        if rank == 0:
            try:
                newest = int(store.add("joiners", 0))
                waiting = self._joiners(store, decision.admitted, newest)
            except Exception as err:
                raise ReformFailed(f"the job's store is gone: {_first_line(err)}") from err
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
        store = self._same_store()
        staying = [r for r in range(decision.world_size) if r not in check.leaving]
        key = f"gen/{decision.generation}/next"
        if staying and self.rank == staying[0]:
            joiners = self._joiners(store, decision.admitted, check.newest_ticket)
            nxt = planned(decision, check, joiners, step=self.step)
            if nxt is not None:
                nxt = self._decide(store, key, nxt)
                for j in joiners:
                    if j.member in nxt.joined:
                        store.set(f"admit/{j.ticket}", nxt.encode())
                store.set("gen", str(nxt.generation))
        try:
            nxt = Decision.decode(store.get(key))
        except Exception as err:
            raise ReformFailed(f"no agreement in the job's store: {_first_line(err)}") from err
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
        self._teardown()

    # -- around each step -----------------------------------------------------------------

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Around one step: counts it when it completes; when a peer is lost in it, the
        group re-forms without the peer and the step is not counted (the loop does it
        again, with the state every member now shares)."""
        try:
            yield
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            self.recover(err)
            return
        self.step += 1
        pending = self._pending
        if pending is not None:
            self._pending = None
            pending.first_step_at = time.time()
            self._report(pending)
            if self.on_rescaled is not None:
                self.on_rescaled(pending)

    def recover(self, err: BaseException, decision: Decision | None = None) -> Rescale | None:
        """A peer was lost in ``decision``'s generation (default: the current one):
        re-form with the survivors (see the module). ReformFailed when it cannot."""
        decision = decision or self._decision
        if decision is None:
            raise ReformFailed(f"a peer was lost before any generation: {_first_line(err)}")
        failed_at = time.time()
        log.warning(
            "a peer was lost at step %d of generation %d: %s",
            self.step + 1,
            decision.generation,
            _first_line(err),
        )
        for _ in range(5):
            self._teardown()
            store = self._same_store()
            try:
                nxt = self._survive(store, decision)
                if nxt.rank_of(self.member) is None:
                    log.warning("left out of generation %d: joining again", nxt.generation)
                    self._admit_and_enter(store, failed_at)
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
                raise ReformFailed(f"re-forming failed: {_first_line(err2)}") from err2
            if self._pending is not None:
                self._pending.sign_at = self._pending.sign_at or failed_at
                self.rescales.append(self._pending)
            return self._pending
        raise ReformFailed("re-forming failed five times in a row")

    def _survive(self, store: dist.TCPStore, decision: Decision) -> Decision:
        g = decision.generation
        key = f"gen/{g}/next"
        n = int(store.add(f"gen/{g}/survivors", 1))
        rank = decision.rank_of(self.member)
        me = Survivor(self.member, rank if rank is not None else -1, self.step)
        store.set(f"gen/{g}/survivor/{n}", me.encode())
        if n == 1 and not store.check([key]):
            count, changed = 1, time.monotonic()
            deadline = changed + self.timeout_s
            while count < decision.world_size and time.monotonic() < deadline:
                time.sleep(POLL_S)
                now = int(store.add(f"gen/{g}/survivors", 0))
                if now != count:
                    count, changed = now, time.monotonic()
                elif time.monotonic() - changed >= self.recover_window_s:
                    break
            survivors = []
            for i in range(1, count + 1):
                store.wait([f"gen/{g}/survivor/{i}"])
                survivors.append(Survivor.decode(store.get(f"gen/{g}/survivor/{i}")))
            nxt = self._decide(store, key, recovered(decision, survivors))
            store.set("gen", str(nxt.generation))
        return Decision.decode(store.get(key))

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
        self._teardown()
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


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


__all__ = [
    "DEFAULT_GATHER_S",
    "DEFAULT_SETTLE_S",
    "DEFAULT_TIMEOUT_S",
    "InPlaceGroup",
    "ReformFailed",
    "StateSync",
    "publish_rescale",
    "requested",
    "wait_admitted",
]
