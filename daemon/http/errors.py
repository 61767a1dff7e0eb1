"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from daemon.http.responses import ErrorBody, ErrorInfo


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type_, param=param, code=code)
        self.headers: dict[str, str] = {}
        if retry_after_s is not None:  # seconds (429, 503)
            self.headers["retry-after"] = str(retry_after_s)

    def body(self) -> bytes:
        return msgspec.json.encode(ErrorBody(self.info))

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, headers=self.headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)
