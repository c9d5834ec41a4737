"""The chat page at ``/``: one static HTML page with its script and style sheet (``static/``), no build
step and nothing fetched from elsewhere, so it works offline. It talks to ``/v1/chat/completions`` like
any client (streaming); an API key, when the server has one, is typed into the page's settings.

The files are read once, when the app is made; a strict Content-Security-Policy allows this server's own
script and style only, so even a reply that smuggled markup could not run code (the page also inserts
text as text)."""
from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

__all__ = ["add_chat_page", "page_files"]

# path -> (file in static/, media type)
PAGES = {"/": ("chat.html", "text/html; charset=utf-8"),
         "/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
         "/chat.css": ("chat.css", "text/css; charset=utf-8")}
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page_files() -> dict[str, bytes]:
    """The page's files by URL path, as served."""
    folder = resources.files("lightspeed.serve") / "static"
    return {path: (folder / name).read_bytes() for path, (name, _) in PAGES.items()}


def add_chat_page(app: FastAPI) -> None:
    """Serve the chat page (``/``) and its assets on ``app``."""
    files = page_files()
    headers = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
               "Cache-Control": "no-cache"}

    def route(path: str, media_type: str):
        body = files[path]

        async def serve_file() -> Response:
            return Response(body, media_type=media_type, headers=headers)
        serve_file.__name__ = "page_" + (PAGES[path][0].replace(".", "_"))
        return serve_file

    for path, (_, media_type) in PAGES.items():
        app.add_api_route(path, route(path, media_type), methods=["GET"], include_in_schema=False)
