"""Who may ask ``vlp serve`` anything: one shared secret, from the environment, for every route but the probes.

With ``VLP_SERVE_TOKEN`` set (the chart sets it from a Secret: ``serving.auth``), every request must carry the token,
either as a bearer token (``Authorization: Bearer <token>``, what scripts and KServe clients send) or as the
password of HTTP basic auth with any user name (what a browser asks for when the search page answers 401). The
health probes (:data:`OPEN_PATHS`) stay open, so a kubelet or a load balancer needs no secret. A missing or wrong
credential gets 401 and ``{"error": ...}``, and the token is compared in constant time. Unset, every route is open,
as before; the server then warns when it listens on an address other than loopback.

A credential in the URL is refused on every route, the probes included (400, naming the ``Authorization`` header): a
query parameter named as one (:data:`URL_CREDENTIALS`: ``?token=``, ``?access_token=``, ...) or whose name or value is
the token (``?q=<token>``). A URL lands in proxies' logs and browsers' histories; the server's own log never shows a
query string, nor the token where a client puts it in a path (:func:`vlp.serve.server.private_logs`).

The token never comes from the command line: arguments are visible to every user of the machine (``ps``) and land in
shell histories and pod specs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from vlp.serve.querystring import parameters

log = logging.getLogger(__name__)

TOKEN_ENV = "VLP_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
OPEN_PATHS = frozenset({"/healthz", "/v2/health/live", "/v2/health/ready"})  # the probes: no credential needed
CHALLENGE = 'Basic realm="vlp serve", charset="UTF-8", Bearer realm="vlp serve"'
# query parameters that name a credential: refused, whatever their value
URL_CREDENTIALS = frozenset({"token", "access_token", "auth_token", "api_key", "apikey", "auth", "authorization",
                             "password", "bearer"})  # fmt: skip


def token_from(environ: Mapping[str, str] = os.environ) -> str | None:
    """The token ``VLP_SERVE_TOKEN`` holds, or None when it is unset.

    Raises:
        ValueError: it is set but empty, shorter than :data:`MIN_TOKEN_CHARS`, or holds a character that is not
            printable ASCII (it travels in an HTTP header). The message never shows the value.
    """
    token = environ.get(TOKEN_ENV)
    if token is None:
        return None
    if not token:
        raise ValueError(f"{TOKEN_ENV} is set but empty: unset it to serve without authentication, or give a token")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{TOKEN_ENV} holds {len(token)} characters: a token needs at least {MIN_TOKEN_CHARS}")
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise ValueError(f"{TOKEN_ENV} holds a character that is not printable ASCII (spaces included)")
    return token


def presented(authorization: bytes) -> bytes | None:
    """The secret an ``Authorization`` header value presents (a bearer token, or basic auth's password), or None."""
    scheme, _, value = authorization.strip().partition(b" ")
    value = value.strip()
    if scheme.lower() == b"bearer":
        return value or None
    if scheme.lower() == b"basic":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        _, colon, password = decoded.partition(b":")
        return password if colon else None
    return None


def in_url(query_string: bytes, token: bytes) -> str | None:
    """Which parameter of ``query_string`` carries a credential (see the module's docstring), or None. The message
    never shows the token."""
    for name, value in parameters(query_string):
        said = name.decode("utf-8", "replace")
        if said.strip().lower() in URL_CREDENTIALS:
            return f"the query parameter {said!r}"
        if hmac.compare_digest(name, token) or hmac.compare_digest(value, token):
            return "a query parameter holding the token"
    return None


class RequireToken:
    """ASGI middleware: a request to any path but :data:`OPEN_PATHS` needs ``token`` (see the module's docstring),
    else it gets 401 before the app (or the request body) is read; one with a credential in its URL gets 400 on every
    path."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token.encode("ascii")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = in_url(scope.get("query_string") or b"", self.token)
        if where is not None:
            log.warning("%s %s: 400 a credential in the URL", scope.get("method"), scope.get("path"))
            message = (f"a credential in the URL ({where}) is refused: a URL lands in logs and browser histories; "
                       f"send the token of {TOKEN_ENV} in the Authorization header, as 'Authorization: Bearer <token>' "
                       "or as basic auth's password")  # fmt: skip
            await JSONResponse({"error": message}, status_code=400)(scope, receive, send)
            return
        if scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = [value for name, value in scope.get("headers") or [] if name == b"authorization"]
        if len(given) > 1:  # which one holds? A proxy and the app may each read another: none does
            log.warning("%s %s: 400 %d Authorization headers", scope.get("method"), scope.get("path"), len(given))
            message = f"{len(given)} Authorization headers: send the token of {TOKEN_ENV} in one"
            await JSONResponse({"error": message}, status_code=400)(scope, receive, send)
            return
        secret = presented(given[0]) if given else None
        if secret is not None and hmac.compare_digest(secret, self.token):
            await self.app(scope, receive, send)
            return
        what = "a wrong credential" if secret is not None else "no credential"
        log.warning("%s %s: 401 %s", scope.get("method"), scope.get("path"), what)
        response = JSONResponse(
            {"error": f"{what}: send the token of {TOKEN_ENV} as 'Authorization: Bearer <token>' or as basic auth's "
                      "password"},
            status_code=401,
            headers={"WWW-Authenticate": CHALLENGE},
        )  # fmt: skip
        await response(scope, receive, send)
