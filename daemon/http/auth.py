"""Who may call what: `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`, what
the `anthropic` package sends) against the keys in daemon/apikeys.py; 401 without a valid
key, 403 for a key outside its scope."""

from __future__ import annotations

from starlette.requests import Request

from daemon.apikeys import ApiKey, KeyRing, Scope
from daemon.http.errors import ApiError


def authorize(keys: KeyRing | None, request: Request, scope: Scope) -> ApiKey | None:
    """The caller's key; None when no key is needed (no keys file, open monitoring)."""
    if keys is None:
        return None
    secret = bearer(request.headers.get("authorization")) or \
        (request.headers.get("x-api-key") or "").strip() or None
    if secret is None:
        raise unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
    key = keys.lookup(secret)
    if key is None:
        raise unauthorized("incorrect API key provided")
    if not key.allows(scope):
        raise ApiError(403, f"key {key.name!r} may not use {request.url.path}",
                       "permission_error")
    return key


def bearer(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    kind, _, secret = authorization.partition(" ")
    return secret.strip() if kind.lower() == "bearer" and secret.strip() else None


def unauthorized(message: str) -> ApiError:
    error = ApiError(401, message, "invalid_request_error", code="invalid_api_key")
    error.headers = {"www-authenticate": "Bearer"}
    return error
