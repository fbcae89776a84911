"""The web console's files: ``/`` is its page, ``/console/NAME`` its modules and style sheet.

The console is plain ES modules and one style sheet shipped in this package (``console/``), with
no build step and nothing fetched from anywhere else at run time. The files are read once, when the
listener starts, and served from memory. What the page does: docs/console.md.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from agentsessions.sdk.structs import struct

ASSET_PREFIX = "/console/"
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}


@struct(frozen=True)
class Asset:
    body: bytes
    content_type: str


def load_assets() -> dict[str, Asset]:
    """Every file of the console directory by name (blocking: run it off the event loop)."""
    folder = resources.files("agentsessions.host.http").joinpath("console")
    assets: dict[str, Asset] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            assets[entry.name] = Asset(entry.read_bytes(), _TYPES[suffix])
    return assets


class Console:
    def __init__(self, assets: dict[str, Asset]) -> None:
        self.assets = assets

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/", self.page), web.get(ASSET_PREFIX + "{name}", self.asset)]

    async def page(self, request: web.Request) -> web.Response:
        return self._answer("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        return self._answer(request.match_info["name"])

    def _answer(self, name: str) -> web.Response:
        asset = self.assets.get(name)
        if asset is None:
            raise web.HTTPNotFound(reason=f"no console file {name[:80]!r}")
        answer = web.Response(body=asset.body, content_type=asset.content_type)
        if asset.content_type.startswith("text/"):
            answer.charset = "utf-8"
        # Served with the host, changed with the host: revalidate on every load.
        answer.headers["Cache-Control"] = "no-cache"
        return answer
