"""``/docs``: the interactive API page of a service, served wholly by the service.

FastAPI's default page loads Swagger UI's script and style from a CDN, which fails on a
machine with no internet access (where GPU fleets often run). Here the assets come from
the ``swagger-ui-bundle`` package, under ``/docs/assets``; the page needs nothing but
the service itself. Create the app with ``docs_url=None, redoc_url=None``, then call
:func:`serve_api_docs`.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"


def serve_api_docs(app: FastAPI) -> None:
    """Mount ``/docs`` (Swagger UI over the app's ``/openapi.json``) and its assets."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("create the app with docs_url=None and redoc_url=None")
    app.mount(ASSETS_PATH, StaticFiles(directory=swagger_ui_path), name="api-docs-assets")
    title = f"{app.title} API"
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def api_docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
            # Swagger UI would otherwise send the document to validator.swagger.io to
            # draw a badge (in layouts that have one): nothing leaves the service.
            swagger_ui_parameters={"validatorUrl": None},
        )
