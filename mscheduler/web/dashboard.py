"""The web dashboard: static HTML, CSS and JavaScript (``web/static/``) served at ``/ui/``.

The dashboard is a client of the JSON API and nothing else: its pages call ``/api/v1`` with the
token the user typed in (kept in the browser tab's sessionStorage), so every rule and query stays
in ``Operations``. Its files need no token — they hold no data — and nothing is loaded from
elsewhere (no CDN: the machines that run it may be offline). The responses carry a strict
Content-Security-Policy: scripts and styles only from the package's files, requests only to this
origin, no framing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

DASHBOARD_PATH = "/ui"
STATIC_DIR = Path(__file__).parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # the files change with the package: revalidate (ETag) rather than keep an old copy
    "Cache-Control": "no-cache",
}


def is_dashboard_path(path: str) -> bool:
    """The paths that need no token: the site root (a redirect) and the dashboard's files."""
    return path in ("", "/", DASHBOARD_PATH) or path.startswith(DASHBOARD_PATH + "/")


class DashboardFiles(StaticFiles):
    """The package's static files, with the security headers on every answer."""

    def __init__(self) -> None:
        super().__init__(directory=STATIC_DIR, html=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, send_with_headers)


async def _to_dashboard() -> RedirectResponse:
    """``/`` → ``ui/`` (relative, so it also works when the app is mounted under a prefix)."""
    return RedirectResponse("ui/", status_code=307)


async def _into_dashboard() -> RedirectResponse:
    """``/ui`` → ``ui/`` (relative: Starlette's own slash redirect would name the ``Host`` the
    client sent)."""
    return RedirectResponse("ui/", status_code=307)


def mount_dashboard(app: FastAPI) -> None:
    """Serve the dashboard at ``/ui/`` and send ``/`` and ``/ui`` there."""
    app.add_api_route("/", _to_dashboard, methods=["GET"], include_in_schema=False)
    app.add_api_route(DASHBOARD_PATH, _into_dashboard, methods=["GET"], include_in_schema=False)
    app.mount(DASHBOARD_PATH, DashboardFiles(), name="dashboard")
