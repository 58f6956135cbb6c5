"""The health page and its JSON as a FastAPI app, for the Airflow API server to mount.

``plugins/sessionlake_health.py`` mounts :func:`create_app` at ``/sessionlake``:

* ``GET /sessionlake/`` — the page (:mod:`sessionlake.health_page`);
* ``GET /sessionlake/api/health`` — the same as JSON (:meth:`Health.as_json`).

Airflow does not protect plugin apps: anyone who reaches the API server reaches them. So
every route depends on :func:`airflow_guards`, Airflow's own checks of the caller: the
API's JWT (``Authorization: Bearer``) or the UI's ``_token`` cookie, validated by the
configured auth manager; the user must be allowed to use the Airflow UI and to read the
DAG :data:`HEALTH_DAG` (the page shows the lake's paths, its runs' pids, its snapshots
and retention runs: what that DAG's readers may see). A request without a token gets
401, one with a bad token, or from a user without those rights, 403.

The lake is ``SESSIONLAKE_LAKE`` (and the checkpoint ``SESSIONLAKE_CHECKPOINT``) in the
API server's environment, read on every request through :func:`sessionlake.config.settings_from`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse

from sessionlake.config import ConfigError, Settings, settings_from
from sessionlake.health import collect_health
from sessionlake.health_page import render_health_page

#: Where the Airflow plugin mounts the app.
URL_PREFIX = "/sessionlake"


def lake_settings() -> Settings:
    """The lake to show, from the environment; 503 when none is configured."""
    try:
        return settings_from({})
    except ConfigError as error:
        raise HTTPException(status_code=503, detail=str(error)) from None


LakeSettings = Annotated[Settings, Depends(lake_settings)]


#: The DAG whose readers may see the health page: the micro-batch DAG, whose runs write
#: what the page shows.
HEALTH_DAG = "sessionlake_microbatch"


def airflow_guards() -> list[Callable[..., Any]]:
    """FastAPI dependencies: the logged-in Airflow user who may use the UI and read
    :data:`HEALTH_DAG`.

    Airflow's ``requires_access_view`` and ``requires_access_dag``: the user comes from the
    bearer token or the ``_token`` cookie through the auth manager (401 without a token,
    403 for a bad or expired one), then the auth manager must allow the ``WEBSITE`` view
    and a ``GET`` of the DAG (403 otherwise).
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_dag, requires_access_view

    return [requires_access_view(AccessView.WEBSITE),
            requires_access_dag("GET", param_dag_id=HEALTH_DAG)]


def create_app(authorize: Callable[..., Any] | None = None) -> FastAPI:
    """The app; every route depends on ``authorize`` (default :func:`airflow_guards`).

    :param authorize: a FastAPI dependency that raises for a caller who may not see the
        page. Tests pass another one only to check the app without Airflow.
    """
    guards = [authorize] if authorize else airflow_guards()
    app = FastAPI(
        title="sessionlake health",
        description="Pipeline health of the sessionlake lake: the page and its JSON.",
        dependencies=[Depends(guard) for guard in guards],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/", response_class=HTMLResponse, summary="The health page")
    def page(settings: LakeSettings, request: Request) -> HTMLResponse:
        # The JSON's path as the server mounts it (the page may be reached without "/").
        json_path = request.url_for("health_json").path
        return HTMLResponse(render_health_page(collect_health(settings), json_path))

    @app.get("/api/health", summary="The health as JSON")
    def health_json(settings: LakeSettings) -> dict[str, Any]:
        return collect_health(settings).as_json()

    @app.get("/api/health/status", summary="ok (200) or unhealthy (503), and why")
    def health_status(settings: LakeSettings) -> JSONResponse:
        health = collect_health(settings)
        return JSONResponse({"status": health.status, "problems": health.problems},
                            status_code=200 if health.status == "ok" else 503)

    return app
