"""Dead letters: what a consumer cannot decode or process goes to ``<env>.dlq`` with the
reason and the record's coordinates, and is logged; nothing is lost silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from aiokafka import ConsumerRecord
from aiokafka.errors import (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from dlrover_events.backoff import Backoff
from dlrover_events.bus.producer import Producer, event_key
from dlrover_events.bus.topics import topic_of
from schemas.codec import encode
from schemas.dlq import DeadLetter, FailureKind, fitting_letter

log = logging.getLogger(__name__)


def dead_letter(
    env: str, record: ConsumerRecord, kind: FailureKind, error: str, group: str
) -> DeadLetter:
    """A dead letter of ``record`` that any producer can send: whatever the record holds,
    the letter fits an event's bound (`schemas.dlq.fitting_letter`)."""
    return fitting_letter(
        env=env,
        original_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        kind=kind,
        error=error,
        group=group,
    )


def log_dead_letters(letters: Iterable[DeadLetter]) -> None:
    """One warning per dead letter, saying where the record was and why it failed."""
    for letter in letters:
        log.warning(
            "dead-lettered %s[%d]@%d%s: %s",
            letter.original_topic,
            letter.partition,
            letter.offset,
            f" ({letter.original_size} bytes, kept truncated)" if letter.truncated else "",
            letter.error,
        )


#: The broker (or the client) refuses the record for what it is: sending it again as it
#: is cannot succeed, whatever the broker's state.
_REFUSED = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)


def _where(letter: DeadLetter) -> str:
    return f"{letter.original_topic}[{letter.partition}]@{letter.offset}"


async def send_dead_letters(
    producer: Producer, letters: Sequence[DeadLetter], *, max_backoff_s: float = 5.0
) -> int:
    """Publish dead letters and return how many the broker acked.

    A letter the broker refuses for its size is sent again without the original bytes
    (the reason and the coordinates are what matter), and one refused even so is logged
    and skipped: a consumer must never stop for good on a letter. Any other failure (the
    broker away) is retried with a backoff, each time saying why, because the offsets
    must not be committed past a record whose letter is not on the bus."""
    todo = list(letters)
    sent = attempt = 0
    backoff = Backoff(initial_s=min(0.2, max_backoff_s), max_s=max_backoff_s)
    while todo:
        attempt += 1
        results = await asyncio.gather(
            *(producer.send_raw(topic_of(x), encode(x), event_key(x)) for x in todo),
            return_exceptions=True,
        )
        again: list[DeadLetter] = []
        transient = False
        for letter, result in zip(todo, results, strict=True):
            if not isinstance(result, BaseException):
                sent += 1
            elif isinstance(result, asyncio.CancelledError):
                raise result
            elif isinstance(result, _REFUSED) and letter.original_value is not None:
                log.warning(
                    "dead letter of %s refused (%s: %s); sending it without the original bytes",
                    _where(letter),
                    type(result).__name__,
                    result,
                )
                again.append(
                    letter.model_copy(
                        update={"original_value": None, "original_key": None, "truncated": True}
                    )
                )
            elif isinstance(result, _REFUSED):
                log.error(
                    "could not dead-letter %s (%s: %s); skipped it. Its reason: %s",
                    _where(letter),
                    type(result).__name__,
                    result,
                    letter.error,
                )
            else:
                transient = True
                again.append(letter)
                log.warning(
                    "dead letter of %s not sent (%s: %s); retrying (attempt %d)",
                    _where(letter),
                    type(result).__name__,
                    result,
                    attempt,
                )
        if transient:
            await asyncio.sleep(backoff.delay(attempt))
        todo = again
    return sent
