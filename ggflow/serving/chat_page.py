"""The chat page at ``/``: static files shipped inside the package (ggflow/serving/static: HTML, CSS and plain
JavaScript, no build step, nothing fetched from elsewhere). The page itself needs no API key, as llama-server's
web UI needs none; the API calls it makes carry the key the user types into it."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            # the page runs only its own scripts and talks only to this server
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                       "base-uri 'none'; frame-ancestors 'none'"}


def add_chat_page(app: FastAPI) -> None:
    """GET / (the page) and /static/* (its files); plain Starlette routes, so outside the API key dependency."""
    async def index(request):
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)

    app.router.routes.append(Route("/", index, methods=["GET", "HEAD"]))
    app.router.routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
