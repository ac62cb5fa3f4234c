"""torch integration (extra ``torch``): GPU memory in the samples, OOMs as events (with
what the process held and wanted, so the brain can size the next attempt), and what an
elastic job and a cluster scheduler need of a training loop.

    hook = TorchHook(Reporter.from_env(batch_size=256)).start()
    with hook.guard():
        for x, y in hook.track(loader):
            train_step(x, y)
    hook.close()

An elastic job (torchrun, c10d rendezvous) also needs its training to survive a new world:
``ElasticCheckpoint`` saves and resumes it without stalling the step, sharded, at any
world size (and stops the loop cleanly when the agent restarts the workers),
``ElasticSampler`` keeps the order of samples whatever the world size, and ``knob_sync``
lets ``StepKnobs`` switch every rank at the same step. See
``examples/elastic/train_elastic.py`` for the whole loop.

By role: ``hook`` (the loop's reporter, GPU memory, OOM events), ``oom`` (recognising
one), ``gradients`` and ``timing`` (what a cluster scheduler needs: gradient statistics,
the step's split), ``ranks`` (rank, world, a peer lost, knobs in step),
``checkpoint`` (save and resume; ``checkpoint_storage`` its I/O, ``sampler`` the data's
order), ``trial_sync`` (a trial's budget agreed by every rank) and ``exiting`` (a
worker's end without torch's slow finalization, which a restart waits for). Import from
here: the names below are the API.

A job rescaled in place imports ``inplace`` itself (``InPlaceGroup``: the processes re-form
their group at a step boundary instead of restarting; its pure decisions are
``dlrover_events.sdk.membership``). It is not imported here, so a restarting job does not
load it. Nor is ``lost_peers`` (``LostPeerWatch``: on the restart path, a worker ends
itself when the operator says a peer's host was lost, rather than wait in a collective for
the group's timeout), which reads the bus.
"""

from dlrover_events.sdk.torch.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    ElasticCheckpoint,
    SaveReason,
    list_checkpoints,
)
from dlrover_events.sdk.torch.exiting import exit_promptly
from dlrover_events.sdk.torch.gradients import GradientStats
from dlrover_events.sdk.torch.hook import CudaProbe, TorchHook, batch_samples
from dlrover_events.sdk.torch.oom import oom_kind, requested_bytes
from dlrover_events.sdk.torch.ranks import (
    distributed,
    is_peer_failure,
    knob_sync,
    step_knobs,
    world,
)
from dlrover_events.sdk.torch.sampler import ElasticSampler
from dlrover_events.sdk.torch.timing import StepTimer
from dlrover_events.sdk.torch.trial_sync import TrialSync

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "CudaProbe",
    "ElasticCheckpoint",
    "ElasticSampler",
    "GradientStats",
    "SaveReason",
    "StepTimer",
    "TorchHook",
    "TrialSync",
    "batch_samples",
    "distributed",
    "exit_promptly",
    "is_peer_failure",
    "knob_sync",
    "list_checkpoints",
    "oom_kind",
    "requested_bytes",
    "step_knobs",
    "world",
]
