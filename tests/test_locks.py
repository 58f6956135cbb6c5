"""The stream locks: what a refused first run leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlake.locks import stream_locks


class Refused(Exception):
    """A run's refusal inside its locks, before it wrote anything."""


def test_a_first_run_refused_inside_its_locks_leaves_no_lake_folder(tmp_path: Path) -> None:
    """A refused first run left ``<lake>/_checkpoints/lake.lock``: a lake folder with
    nothing in it but a lock (the README review)."""
    lake = tmp_path / "lake"
    with pytest.raises(Refused), stream_locks(str(lake), str(lake / "_checkpoints" / "s")):
        raise Refused
    assert not lake.exists()


@pytest.mark.parametrize("checkpoint_inside", [True, False])
@pytest.mark.parametrize("written", ["", "sessions/_delta_log/0.json", "_checkpoints/x.json"])
def test_a_lake_folder_is_kept_if_it_was_there_or_anything_came_into_it(
    tmp_path: Path, checkpoint_inside: bool, written: str
) -> None:
    """Only a folder the locks made, holding nothing but them, is removed; a lake that was
    there, or one a run wrote into (a table, a note beside the locks), stays."""
    lake = tmp_path / "lake"
    checkpoint = lake / "_checkpoints" / "s" if checkpoint_inside else tmp_path / "cp"
    if not written:
        lake.mkdir()  # there before the run
    with stream_locks(str(lake), str(checkpoint)):
        if written:
            (lake / written).parent.mkdir(parents=True, exist_ok=True)
            (lake / written).write_text("{}")
    assert lake.is_dir()
    assert (lake / written).exists()
