"""A request's query string, read as the bytes the client sent, before the framework decodes it.

Starlette decodes a query string with ``errors="replace"``: a byte that is not UTF-8 reaches a route as U+FFFD, text
the client never sent, and ``%00`` as a NUL. :class:`QueryText` puts every parameter's name and value, percent-decoded
to bytes, through the text gate (:func:`vlp.text.bytes_problem`, what a query in a JSON body or on the command line
meets) and answers 400 ``{"error": ...}`` on every route, before anything else reads the request.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.responses import JSONResponse

from vlp.text import bytes_problem

log = logging.getLogger(__name__)

SHOWN_NAME = 40  # characters of a parameter's name an error message shows
HINT = "(a query parameter is text: UTF-8, percent-encoded)"


def parameters(query_string: bytes) -> list[tuple[bytes, bytes]]:
    """The ``(name, value)`` pairs of ``query_string``, percent-decoded to bytes (``+`` a space), split as Starlette
    splits them: at each ``&`` (empty pieces skipped), then at the first ``=`` (none: an empty value)."""
    pairs = []
    for piece in query_string.split(b"&"):
        if piece:
            name, _, value = piece.replace(b"+", b" ").partition(b"=")
            pairs.append((unquote_to_bytes(name), unquote_to_bytes(value)))
    return pairs


def query_problem(query_string: bytes) -> str | None:
    """What is wrong with the first parameter of ``query_string`` whose name or value is not text
    (:func:`vlp.text.bytes_problem`), in one line, or None."""
    for name, value in parameters(query_string):
        problem = bytes_problem(name)
        if problem:
            return f"a query parameter's name {problem} {HINT}"
        problem = bytes_problem(value)
        if problem:
            shown = name.decode()
            shown = shown if len(shown) <= SHOWN_NAME else shown[:SHOWN_NAME] + "..."
            return f"the query parameter {shown!r} {problem} {HINT}"
    return None


class QueryText:
    """ASGI middleware: a request whose query string holds a parameter name or value that is not text (bytes that
    are not UTF-8, a NUL) gets 400 and ``{"error": ...}`` before the app sees it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        problem = query_problem(scope.get("query_string") or b"") if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        log.warning("%s %s: 400 %s", scope.get("method"), scope.get("path"), problem)
        await JSONResponse({"error": problem}, status_code=400)(scope, receive, send)
