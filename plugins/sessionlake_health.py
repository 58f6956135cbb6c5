"""Airflow plugin: the sessionlake health page in the Airflow UI.

Thin wiring only; the page, its JSON and the caller check live in
``sessionlake.health_app``. The FastAPI app is served by the API server at
``/sessionlake`` (``/sessionlake/`` the page, ``/sessionlake/api/health`` the JSON), and a
nav entry shows the page inside the UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from sessionlake.health_app import URL_PREFIX, create_app


class SessionlakeHealthPlugin(AirflowPlugin):
    """The health page (a FastAPI app) and its entry in the UI's navigation."""

    name = "sessionlake"
    fastapi_apps = [  # noqa: RUF012 (AirflowPlugin declares these as class attributes)
        {"app": create_app(), "url_prefix": URL_PREFIX, "name": "sessionlake health"},
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "Pipeline health",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "sessionlake-health",
        },
    ]
