"""Age limits as row conditions: which rows of each table a cut-off date reaches.

Shared by a retention run, which deletes by the limits it is given, and a restore, which
deletes again by the cut-offs that retention runs since the snapshot applied (the rows
the snapshot still holds would otherwise come back).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column
from pyspark.sql import functions as F

from sessionlake.tables import (
    EVENTS,
    LATE_EVENTS,
    OPEN_SESSIONS,
    QUARANTINE,
    SESSION_CHANGELOG,
    SESSIONS,
)


def cutoff_conditions(sessions_cutoff: date | None, events_cutoff: date | None
                      ) -> dict[str, Column]:
    """The rows older than the cut-offs, by table (``None``: no such limit).

    Sessions go by start date, open ones too (with their changelog rows): a stream whose
    input stalls keeps its sessions open, and the page paths in them, as long as it stalls.
    Events go by event date, together with the late and quarantined records, which are
    events too.
    """
    limits: dict[str, Column] = {}
    if sessions_cutoff is not None:
        cutoff = F.lit(sessions_cutoff)
        limits[SESSIONS] = F.col("session_date") < cutoff
        limits[OPEN_SESSIONS] = F.to_date("session_start") < cutoff
        limits[SESSION_CHANGELOG] = F.to_date("session_start") < cutoff
    if events_cutoff is not None:
        cutoff = F.lit(events_cutoff)
        limits[EVENTS] = F.col("event_date") < cutoff
        limits[LATE_EVENTS] = F.to_date("event_time") < cutoff
        limits[QUARANTINE] = F.to_date("quarantined_at") < cutoff
    return limits
