"""Progress bars for long commands, on an interactive terminal only.

A backfill, a compaction of every table or an available-now run over a full landing folder
can take minutes; on a terminal, a `rich <https://rich.readthedocs.io>`_ bar shows that
they move. Anywhere else (Airflow task logs, pipes, CI) nothing is drawn: a log is no place
for a redrawn line.

Example::

    with progress("compacting", total=len(tables)) as step:
        for table in tables:
            compact(table)
            step(table)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Step = Callable[[str], None]


def _no_step(_note: str) -> None:
    """What a step does where no bar is drawn."""


def interactive() -> bool:
    """Whether standard error is a terminal a person watches."""
    return sys.stderr.isatty()


@contextmanager
def progress(
    description: str, total: int | None = None, *, console: Any = None
) -> Iterator[Step]:
    """A progress bar for the block; yields ``step(note)``, to call once per unit done.

    :param total: how many steps there will be; ``None`` for a count without an end
        (a spinner with the number done).
    :param console: the ``rich`` console to draw on; default: standard error, and only
        when it is a terminal (otherwise ``step`` does nothing).
    """
    if console is None and not interactive():
        yield _no_step
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    else:
        columns += [TextColumn("{task.completed} done")]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=console or Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total)

        def step(note: str) -> None:
            bar.update(task, advance=1, description=f"{description}: {note}")

        yield step
