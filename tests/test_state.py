"""When the ``open_sessions`` MERGE names its source's session ids (``sessionlake.state``)."""

from __future__ import annotations

import pytest

from sessionlake.state import LITERAL_KEYS_MAX, STATE_ROWS_PER_LITERAL, names_session_ids


@pytest.mark.parametrize(
    ("source_rows", "state_rows", "named"),
    [
        (100, 1_000_000, True),     # a restart's few changes over a large state
        (100, 10_000, True),        # just enough state per change
        (1_000, 10_000, False),     # too little state to spare
        (1_000, 1_000_000, True),
        (3_000, 1_000_000, False),  # too many literals to plan
        (LITERAL_KEYS_MAX, STATE_ROWS_PER_LITERAL * LITERAL_KEYS_MAX, True),
        (LITERAL_KEYS_MAX + 1, 10**12, False),
        (0, 0, True),               # nothing to name: an empty list, nothing matches
        (None, 1_000_000, False),   # sizes unknown: joined
        (100, None, False),
    ],
)
def test_names_session_ids_only_for_a_small_source_over_much_state(
    source_rows: int | None, state_rows: int | None, named: bool
) -> None:
    assert names_session_ids(source_rows, state_rows) is named
