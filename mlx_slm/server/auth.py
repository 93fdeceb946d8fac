"""Auth: a Bearer key (--api-key or MLX_SLM_API_KEY) on every route but /health and
/metrics, compared in constant time."""

from __future__ import annotations

import hmac
import os
from typing import Any

from .errors import HTTPError

API_KEY_ENV = "MLX_SLM_API_KEY"


def api_key_from_env(given: str | None) -> str | None:
    return given or os.environ.get(API_KEY_ENV) or None


def check_auth(request: Any, key: str | None) -> None:
    """A 401 unless the request carries `Authorization: Bearer <key>` (no key set: open)."""
    if not key:
        return
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise HTTPError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY'",
            "authorization",
            headers={"WWW-Authenticate": "Bearer"},
        )
