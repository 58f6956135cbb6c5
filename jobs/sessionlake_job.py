"""spark-submit entry point: run one ``sessionlake`` command inside the submitted driver.

``spark-submit jobs/sessionlake_job.py run --source ... --lake ...`` takes the same
arguments as the ``sessionlake`` command. The Spark session is created first from what
spark-submit was given (master from the Airflow connection, Delta jars, driver memory), so
the command reuses it rather than building its own on the default ``local[*]``.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from sessionlake import cli

if __name__ == "__main__":
    SparkSession.builder.getOrCreate()
    sys.exit(cli.main(sys.argv[1:]))
