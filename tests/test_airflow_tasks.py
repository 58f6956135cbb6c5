"""The tasks' failure alerts: the line that says why a task failed."""

from __future__ import annotations

import pytest

from sessionlake.airflow_tasks import alert_cause

#: The Spark provider's error for a spark-submit that failed: its command line, its status,
#: then the job's last output lines.
SUBMIT_FAILED = ("Cannot execute: spark-submit --master local[*] --name sessionlake-erasure "
                 "jobs/sessionlake_job.py retention --lake /lake. Error code is: {code}.\n"
                 "Last spark-submit output:\n"
                 "WARNING: Using incubator modules: jdk.incubator.vector\n"
                 "{said}"
                 "26/12/06 17:49:01 WARN SparkSession: Using an existing Spark session; "
                 "only runtime SQL configurations will take effect.")


@pytest.mark.parametrize(("error", "cause"), [
    # Killed (a task marked failed in the UI): the last line was Spark's warning (a
    # hands-on review's erasure).
    (SUBMIT_FAILED.format(code=-9, said=""),
     "spark-submit was killed by signal 9 (the task was stopped, or the machine killed "
     "the job); running it again finishes what it began"),
    # The command's own line, with Spark's warning after it.
    (SUBMIT_FAILED.format(code=2, said="sessionlake: error: no lake at /lake\n"),
     "sessionlake: error: no lake at /lake"),
    (SUBMIT_FAILED.format(code=130, said="sessionlake: retention interrupted before it "
                                         "finished\n"),
     "sessionlake: retention interrupted before it finished"),
    # Another status without a line of the command's: the error's last line.
    (SUBMIT_FAILED.format(code=1, said=""),
     "26/12/06 17:49:01 WARN SparkSession: Using an existing Spark session; only runtime "
     "SQL configurations will take effect."),
    ("param shuffle_partitions=0 is invalid: must be at least 1",
     "param shuffle_partitions=0 is invalid: must be at least 1"),
    ("", "no error given"),
])
def test_the_alert_quotes_the_line_that_says_why(error: str, cause: str) -> None:
    assert alert_cause(error) == cause
