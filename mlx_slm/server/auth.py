"""Auth: a Bearer key (--api-key or MLX_SLM_API_KEY) on every route but /health and
/metrics, compared in constant time as bytes (the header's, the key's UTF-8)."""

from __future__ import annotations

import hmac
import os
from typing import Any

from .errors import HTTPError

API_KEY_ENV = "MLX_SLM_API_KEY"


def api_key_from_env(given: str | None) -> str | None:
    """The key: --api-key as given (a blank one is refused by `ServeOptions`, not taken for none),
    else $MLX_SLM_API_KEY when set and not empty, else None (no key)."""
    return given if given is not None else (os.environ.get(API_KEY_ENV) or None)


def check_auth(request: Any, key: str | None) -> None:
    """A 401 unless the request carries `Authorization: Bearer <key>` (no key set: open)."""
    if not key:
        return
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    # Header values arrive as latin-1 text (one char a byte): back to the bytes the client sent,
    # compared with the key's UTF-8 bytes, so a key like 'clé' works from any UTF-8 client.
    sent = token.strip().encode("latin-1", errors="replace")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent, key.encode("utf-8")):
        raise HTTPError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY'",
            "authorization",
            headers={"WWW-Authenticate": "Bearer"},
        )
