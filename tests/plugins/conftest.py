"""Airflow for the plugin tests: the same throwaway AIRFLOW_HOME set-up as the DAG tests.

Importing ``tests.dags.conftest`` sets the Airflow environment (AIRFLOW_HOME, the plugins
folder) before anything imports airflow, and brings its ``airflow_home`` fixture.
"""

from __future__ import annotations

from tests.dags.conftest import AIRFLOW_ENV, airflow_home

__all__ = ["AIRFLOW_ENV", "airflow_home"]
