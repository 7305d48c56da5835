"""One error shape on every route and every status: ``{"error": {"message", "type", "param",
"code"}}`` — SGLang's ``{"error": {"message"}}`` with OpenAI's fields, so the native routes and
the ``/v1`` routes answer alike and the ``openai`` client reads the message.

Keeps: schema violations (and JSON that does not parse, or text that is not UTF-8) are 400
naming the field; an unknown route 404, a wrong method 405, a missing API key 401; an
exception out of a handler 500 with the exception named, never a plain-text body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One clause per schema error (``where: what``), and the first field named."""
    parts, first = [], None
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        first = first or where
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", first


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, *validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def add_api_key(app: FastAPI, api_key: str) -> None:
    """SGLang's API-key middleware: every route but /health* and /metrics needs the bearer."""

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if request.method == "OPTIONS" or path.startswith(("/health", "/metrics")):
            return await call_next(request)
        if request.headers.get("Authorization") != f"Bearer {api_key}":
            return error_response(401, "Unauthorized: a valid 'Authorization: Bearer' key")
        return await call_next(request)
