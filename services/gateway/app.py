"""The gateway process: FastAPI (page, REST, WebSocket, /metrics) and the public
gRPC server on one event loop.

`GatewayServer(settings).start()` runs it on a background thread (tests, the
`serve` launcher) and returns once both ports are bound.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from headstart.client.errors import ApiError
from services.gateway.data_rest import build_data_router
from services.gateway.grpc_server import start_grpc_server
from services.gateway.openai_api import build_openai_router
from services.gateway.openai_errors import OpenAIError
from services.gateway.request_id import RequestIdMiddleware
from services.gateway.rest import build_router, error_response
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.gateway.ws import session_socket

STATIC_DIR = Path(__file__).parent / "static"
# NOTE: uvicorn closes a WebSocket whose frame exceeds ws_max_size with 1009 and no
# explanation; we let frames up to this size through so the app can answer
# MESSAGE_TOO_LARGE with a proper error message for anything above max_message_bytes.
WS_FRAME_CEILING = 1 << 20


def create_app(settings: GatewaySettings, service: GatewayService | None = None) -> FastAPI:
    service = service or GatewayService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        server, port = await start_grpc_server(service, settings.grpc_host, settings.grpc_port)
        app.state.grpc_port = port
        try:
            yield
        finally:
            await server.stop(grace=1.0)
            await service.stop()

    app = FastAPI(title="headstart gateway", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        service.metrics.errors.labels("rest", exc.code).inc()
        return error_response(exc)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):  # a bug: still a JSON error, counted
        logging.getLogger(__name__).exception("REST request failed")
        service.metrics.errors.labels("rest", "INTERNAL").inc()
        return both_shapes(500, "INTERNAL", type(exc).__name__)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException):
        """An unknown path (404) or method (405): neither REST's nor OpenAI's clients know which
        API a wrong URL was meant for, so the body is in both shapes."""
        code = {404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}.get(exc.status_code, "INVALID_ARGUMENT")
        message = (f"no route {request.method} {request.url.path}: this server has the headstart REST API and "
                   "OpenAI's /v1/models, /v1/chat/completions, /v1/completions (no embeddings, images, audio)"
                   if exc.status_code == 404 else f"{request.method} is not allowed on {request.url.path}")
        return both_shapes(exc.status_code, code, message, dict(exc.headers or {}))

    app.include_router(build_router(service))
    app.include_router(build_data_router(service))  # /v1/data/...: data sessions, flash questions, SSE
    app.include_router(build_openai_router(service))  # /v1/models, /v1/chat/completions, /v1/completions

    @app.websocket("/v1/sessions/ws")
    async def ws_endpoint(ws: WebSocket):
        await session_socket(ws, service)

    @app.get("/")
    async def index():
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(RequestIdMiddleware)
    return app


def both_shapes(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    """An error body that REST clients (`code`, `message`) and OpenAI clients (`error`) both read."""
    openai_code = "not_found" if status == 404 else code.lower()
    body = {"code": code, "message": message, **OpenAIError(status, message, openai_code).body()}
    return JSONResponse(body, status_code=status, headers=headers)


class GatewayServer:
    """Runs the gateway on its own thread and event loop."""

    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.app = create_app(settings)
        self._sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((settings.host, settings.port))
        self.http_port = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", ws_max_size=WS_FRAME_CEILING, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="headstart-gateway", daemon=True)

    @property
    def grpc_port(self) -> int:
        return self.app.state.grpc_port

    @property
    def service(self) -> GatewayService:
        return self.app.state.service

    def start(self, timeout_s: float = 30.0) -> "GatewayServer":
        self._thread.start()
        end = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("the gateway did not start (see its log)")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)

    def _run(self) -> None:
        self._server.run(sockets=[self._sock])
