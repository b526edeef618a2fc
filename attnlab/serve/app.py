"""The web app of `attnlab serve`: the page, its JSON API, and serving it with uvicorn.

    GET  /            the explorer page (static/index.html, its script and style under /static/)
    GET  /api/info    {"runs": [each run's Explorer.info()], "limits": LIMITS}
    POST /api/run     a JSON object {"run": index, "text": ..., "heads_off": {...}, ...} -> Explorer.run

Every refusal is a JSON object {"error": one line} with its status: 400 a bad field, 403 a file
path when files are not allowed, 413 a body or an input over the limits, 415 a body that is not
declared JSON (a form posted from another site cannot reach the models). Nothing is written
through the API. On a loopback address only requests naming that host are served, so a web
page elsewhere cannot reach the server by rebinding its own name to 127.0.0.1.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from attnlab.errors import AttnlabError, UsageError
from attnlab.serve.explorer import Explorer
from attnlab.views.limits import LIMITS, Refused

STATIC = Path(__file__).parent / "static"
# the page loads only its own script and style, and runs no inline code
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine alone (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def create_app(explorers: list[Explorer], host: str = "127.0.0.1") -> Starlette:
    """The explorer's Starlette app over ``explorers`` (one per run, shown side by side), served
    as ``host``."""

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def info(request: Request) -> JSONResponse:
        return JSONResponse({"runs": [e.info() for e in explorers], "limits": asdict(LIMITS)})

    async def run(request: Request) -> JSONResponse:
        body = await read_json(request, LIMITS.max_body)
        index = body.get("run", 0)
        if type(index) is not int or not 0 <= index < len(explorers):
            raise Refused(f"run must be the index of a served run, 0..{len(explorers) - 1} (got {json.dumps(index)})")
        return JSONResponse(await run_in_threadpool(explorers[index].run, body))

    async def refused(request: Request, err: Exception) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=getattr(err, "status", 400))

    hosts = ["127.0.0.1", "localhost", "::1", host] if is_loopback(host) else ["*"]
    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/info", info),
            Route("/api/run", run, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)],
        exception_handlers={AttnlabError: refused},
    )


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's body, a JSON object of at most ``limit`` bytes; refused otherwise, unread
    beyond the limit."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Refused("send the request as JSON (Content-Type: application/json)", status=415)
    too_large = f"the request body is over the limit of {limit:,} bytes"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(too_large, status=413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(too_large, status=413)
    try:
        data = json.loads(body)
    except ValueError:
        raise Refused("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise Refused("the request body must be a JSON object")
    return data


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening (port 0: a free one); one line saying why
    when it cannot be."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535 (got {port})")
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror:
        raise UsageError(f"--host {host}: not an address of this machine") from None
    sock = socket.socket(family, kind)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # a port left in TIME_WAIT is free; one listened on is not
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is in use; stop what listens there, or choose another --port"
            ) from None
        raise UsageError(f"cannot listen on {host} port {port}: {err.strerror}") from None
    sock.listen(128)
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on the listening ``sock`` until Ctrl-C (uvicorn, its access log off), which
    then ends as it ends every command: KeyboardInterrupt (exit status 130). uvicorn catches the
    signal to shut down gracefully and raises it again afterwards, but inside asyncio.run, where it
    may only cancel the finished task: whether a KeyboardInterrupt came out depended on timing (a
    test saw exit status 0 once in several runs), so it is raised here."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    if server.should_exit:  # stopped by a signal, not by an error
        raise KeyboardInterrupt
