"""Request bodies arrive in time or not at all: an ASGI middleware that bounds how long the app
waits for a request's body, whatever the route reads it with (ingest's stream, FastAPI's
body parsing). A client whose Content-Length promises more than it sends held a connection
(and the handler waiting on it) forever; now it gets a 408 and the connection is closed."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError

log = logging.getLogger(__name__)


class BodyTimeout(HTTPException):
    """Raised from `receive`. An HTTPException because FastAPI passes those on from its body
    parsing unchanged (anything else becomes a 400 "error parsing the body")."""

    def __init__(self, timeout_s: float):
        super().__init__(408)
        # The rest of the body may still come: the connection cannot carry another request.
        self.error = ApiError(408, f"request body not received within {timeout_s:g} s", loc=["body"], type="body_timeout",
                              headers={"Connection": "close"})


class BodyDeadline:
    def __init__(self, app: ASGIApp, *, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_done = False

        async def receive_in_time() -> Message:
            nonlocal body_done
            if body_done:  # afterwards the app may wait for a disconnect as long as it likes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.timeout_s) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, receive_in_time, send)


async def body_timeout_error(_request: Request, exc: BodyTimeout) -> JSONResponse:
    error = exc.error
    log.info("request body not received within the body timeout; answered 408 and closed the connection")
    return JSONResponse({"detail": error.detail}, status_code=error.status, headers=error.headers)


async def client_gone(request: Request, _exc: Exception) -> Response:
    # Nobody is left to answer: an agent that died or timed out mid-push, which is not a fault
    # of the collector; it sends the batch again.
    log.info("client disconnected before sending the whole body of %s %s", request.method, request.url.path)
    return Response(status_code=400)
