"""torchrun's entry point for the ``dlrover-c10d`` rendezvous (``torchrun.handlers``).

Apart from ``rendezvous``, and without torch at import: importing torch's rendezvous
package loads every entry point of the group, so an entry point inside ``rendezvous``
(which imports that package) would be loaded half-made by its own import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """What torch registers under the entry point's name: a creator of handlers."""

    def create(params: RendezvousParameters) -> RendezvousHandler:
        from dlrover_events.sdk.torch.rendezvous import create_handler

        return create_handler(params)

    return create
