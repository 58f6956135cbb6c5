"""Delta SQL over the lake's tables by their names, and result printing."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from sessionlake.tables import PUBLIC_TABLES, table_path

OUTPUT_FORMATS: tuple[str, ...] = ("table", "csv", "json")


class LakeNotFound(RuntimeError):
    """The lake folder holds no sessionlake tables."""


def register_tables(spark: SparkSession, lake: str) -> list[str]:
    """Register every table of the lake as a temporary view under its SPEC name.

    :return: the names registered.
    :raises LakeNotFound: when the lake has none of the tables.
    """
    names = []
    for table in PUBLIC_TABLES:
        path = table_path(lake, table)
        if DeltaTable.isDeltaTable(spark, path):
            spark.read.format("delta").load(path).createOrReplaceTempView(table)
            names.append(table)
    if not names:
        raise LakeNotFound(
            f"no sessionlake tables in {lake}: check --lake, or create them with "
            "`sessionlake run`"
        )
    return names


def run_sql(spark: SparkSession, lake: str, statement: str) -> DataFrame:
    """Run ``statement`` with the lake's tables registered by name."""
    register_tables(spark, lake)
    return spark.sql(statement)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def format_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], output: str) -> str:
    """Rows as an aligned text table, CSV with a header, or JSON lines."""
    if output == "json":
        return "".join(
            json.dumps({c: _jsonable(v) for c, v in zip(columns, row, strict=True)}) + "\n"
            for row in rows
        )
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_text(v) for v in row] for row in rows])
        return buffer.getvalue()
    cells = [[_text(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
        *("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells),
        f"({len(rows)} row{'s' if len(rows) != 1 else ''})",
    ]
    return "\n".join(lines) + "\n"


def format_frame(frame: DataFrame, output: str, limit: int | None = None) -> str:
    """Collect ``frame`` (up to ``limit`` rows) and format it with :func:`format_rows`."""
    rows = frame.limit(limit).collect() if limit else frame.collect()
    return format_rows(frame.columns, [tuple(r) for r in rows], output)
