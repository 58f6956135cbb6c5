"""Retrying Delta commits that lost an optimistic-concurrency race.

Delta commits optimistically: two writers (the stream's MERGE, an OPTIMIZE, a retention
DELETE, a backfill overwrite) may both read version N and both try to commit N+1. The loser
gets a ``DeltaConcurrentModificationException`` (``ConcurrentAppendException``,
``ConcurrentDeleteReadException``, ...) and has written nothing visible, so redoing the whole
read-compute-commit step against the new version is safe. Every writer in sessionlake goes
through :func:`retry_on_conflict` so that maintenance never fails the stream, and the stream
never fails maintenance.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from delta.exceptions.base import DeltaConcurrentModificationException

from sessionlake.config import conflict_attempts

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How the JVM names the conflicts when PySpark did not convert them to Delta's classes.
_CONFLICT_MARKERS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def is_commit_conflict(error: BaseException) -> bool:
    """Whether ``error`` is a lost Delta commit race (nothing was written; safe to redo)."""
    if isinstance(error, DeltaConcurrentModificationException):
        return True
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def retry_on_conflict(
    step: Callable[[], T],
    what: str,
    attempts: int | None = None,
    first_wait: float = 0.5,
    max_wait: float = 15.0,
) -> T:
    """Run ``step`` and run it again while it loses a Delta commit race.

    ``step`` must redo its reads: a retry that reused a DataFrame planned against the old
    version would conflict again or, worse, commit a stale result. Waits grow exponentially
    with jitter so that two retrying writers do not collide in lock-step.

    :param step: the whole read-compute-commit unit.
    :param what: what is being committed, for the log.
    :param attempts: tries in all (default :func:`conflict_attempts`).
    :return: what ``step`` returned.
    :raises Exception: the last conflict after ``attempts`` tries, or any other error at once.
    """
    tries = attempts or conflict_attempts()
    for attempt in range(1, tries + 1):
        try:
            return step()
        except Exception as error:
            if attempt == tries or not is_commit_conflict(error):
                raise
            wait = min(max_wait, first_wait * 2 ** (attempt - 1)) * (0.5 + random.random())
            log.warning("%s lost a commit race (attempt %d/%d): %s; retrying in %.1fs",
                        what, attempt, tries, str(error).splitlines()[0][:200], wait)
            time.sleep(wait)
    raise AssertionError("unreachable")
