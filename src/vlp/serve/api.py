"""The JSON API of ``vlp serve``, on the same FastAPI app (and port) as KServe's inference routes.

``GET /api/search?q=&k=``, ``GET /api/clips/{video_id}`` (its stored frames),
``GET /api/clips/{video_id}/thumbnail.jpg``, ``GET /api/clips/{video_id}/frames/{slot}.jpg``, ``POST /api/answer``,
``GET /healthz``, and ``GET /``: a page that searches, shows a hit's frames and asks about it (``page.html``, no
assets from elsewhere) (docs/guides/serve.md). A bad request gets a 4xx and ``{"error": "<one line>"}``, and the server
logs that line: a blank or over-long query or question, or one that is not valid UTF-8 (400), ``k`` outside 1..1000
(400), a query parameter (name or value) that is not text, on every route (400, before anything else:
:class:`vlp.serve.querystring.QueryText`), a parameter or body field of the wrong type or missing (422, for KServe's
routes too), an unknown clip or frame (404), an unknown route (404) or method (405), ``/api/answer`` without a QA
model (404), a request body over :data:`MAX_BODY` bytes (413, on every route), a missing or wrong token where the
server has one (401, :mod:`vlp.serve.auth`) or a credential in the URL (400), and a request uvicorn cannot parse
(400, :class:`vlp.serve.server.OneLineErrors`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from vlp.data.frames import FrameStore
from vlp.index.query import MAX_K
from vlp.serve.auth import RequireToken
from vlp.serve.model import DEFAULT_K, Answerer, SearchModel
from vlp.serve.querystring import QueryText
from vlp.serve.sdk import InvalidInput, ModelNotFound
from vlp.text import MAX_TEXT_CHARS, checked_text

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # bytes of a request body
PAGE = Path(__file__).with_name("page.html")
DEFAULT_ANSWERS = 5
_AT_MOST = f"at most index.max_text_chars characters ({MAX_TEXT_CHARS} by default)"


class ApiError(Exception):
    """A client error: its HTTP status and the one line the response's ``error`` says."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Error(BaseModel):
    error: str = Field(description="what was wrong with the request, one line")


class HitOut(BaseModel):
    rank: int
    video_id: str
    score: float | None = Field(description="the re-ranking score; null past retrieval.rerank_k")
    similarity: float


class SearchOut(BaseModel):
    query: str
    k: int
    hits: list[HitOut]


class AnswerIn(BaseModel):
    video_id: str = Field(description="the clip's id, as a search hit names it")
    question: str = Field(description=f"the question, {_AT_MOST}")
    k: int = Field(DEFAULT_ANSWERS, description=f"answers to return, 1..{MAX_K}")


class AnswerItem(BaseModel):
    answer: str
    probability: float


class AnswerOut(BaseModel):
    video_id: str
    question: str
    answers: list[AnswerItem]


class Health(BaseModel):
    status: str
    model: str
    qa_model: bool = Field(description="whether POST /api/answer has a QA model")
    clips: int = Field(description="clips in the index")
    family: str = Field(description="the model family of the index's model")
    kind: str = Field(description="the index's model kind (a retrieval or pre-trained model)")


class ClipOut(BaseModel):
    video_id: str
    frames: list[str] = Field(description="the URLs of its stored frames (JPEG), in order")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": Error} for code in codes}


def add_routes(app: FastAPI, model: SearchModel, answerer: Answerer | None = None, token: str | None = None) -> None:
    """Add the JSON API to ``app`` (KServe's app in ``vlp serve``; any FastAPI app works): its routes searching
    through ``model`` and answering through ``answerer`` (none: ``POST /api/answer`` is 404), the body size limit,
    the check of every query string (:class:`~vlp.serve.querystring.QueryText`), the one-line error responses and,
    with a ``token``, authentication of every route but the health probes (:mod:`vlp.serve.auth`)."""
    router = APIRouter(tags=["vlp"])

    @router.get("/healthz", response_model=Health, responses=_errors(503))
    async def healthz() -> Any:
        """Liveness and readiness: 200 once the index and its model are loaded."""
        searcher = model.searcher
        if not model.ready or searcher is None:
            raise ApiError(503, f"the model {model.name} is not loaded yet")
        clips = await model.run(searcher.index.count)
        info = searcher.info
        return Health(status="ok", model=model.name, qa_model=answerer is not None, clips=clips,
                      family=info.family.name, kind=info.kind)  # fmt: skip

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        """The search page."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    frames: dict[str, Any] = {}  # the index's frames store, opened on first use

    def frame_store() -> Any:

        searcher = model.searcher
        if searcher is None:
            raise ApiError(503, f"the model {model.name} is not loaded yet")
        if "store" not in frames:
            frames["store"] = FrameStore(searcher.index.info.frames, cache_shards=8)
        return frames["store"]

    def stored_jpegs(video_id: str) -> list[bytes]:
        store = frame_store()
        if video_id not in store:
            raise ApiError(404, f"no clip {video_id!r} in the frames store of the index")
        return store.rows(video_id, ["jpeg"]).column("jpeg").to_pylist()

    @router.get("/api/clips/{video_id}", response_model=ClipOut, responses=_errors(404))
    async def clip(video_id: str) -> Any:
        """The clip's stored frames, as the URLs of their JPEGs (the frames store the index names)."""
        count = len(await model.run(stored_jpegs, video_id))
        base = f"/api/clips/{quote(video_id, safe='')}/frames"
        return {"video_id": video_id, "frames": [f"{base}/{slot}.jpg" for slot in range(count)]}

    @router.get(
        "/api/clips/{video_id}/frames/{slot}.jpg",
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}, "description": "a stored frame"}, **_errors(404)},
    )
    async def frame(video_id: str, slot: int) -> Response:
        """One stored frame of the clip, as extract-frames stored it (JPEG)."""
        jpegs = await model.run(stored_jpegs, video_id)
        if not 0 <= slot < len(jpegs):
            raise ApiError(404, f"clip {video_id!r} has {len(jpegs)} stored frames; no frame {slot}")
        return Response(jpegs[slot], media_type="image/jpeg",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})  # fmt: skip

    @router.get("/api/search", response_model=SearchOut, responses=_errors(400, 422))
    async def search(
        q: str = Query(description=f"the text to search for, {_AT_MOST}"),
        k: int = Query(DEFAULT_K, description=f"hits to return, 1..{MAX_K}"),
    ) -> Any:
        """The ``k`` clips that best match ``q``, best first, as ``vlp search`` ranks them."""
        try:
            hits = (await model.search([q], k))[0]
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return {"query": q, "k": k, "hits": [hit.as_dict() for hit in hits]}

    @router.get(
        "/api/clips/{video_id}/thumbnail.jpg",
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}, "description": "the clip's middle frame"}, **_errors(404)},
    )
    async def thumbnail(video_id: str) -> Response:
        """The JPEG the index stores for the clip (its middle frame)."""
        searcher = model.searcher
        if searcher is None:
            raise ApiError(503, f"the model {model.name} is not loaded yet")
        try:
            jpeg = await model.run(searcher.index.thumbnail, video_id)
        except KeyError:
            raise ApiError(404, f"no clip {video_id!r} in the index") from None
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})

    @router.post("/api/answer", response_model=AnswerOut, responses=_errors(400, 404, 413, 422))
    async def answer(body: AnswerIn) -> Any:
        """The ``k`` most probable answers to a question about a clip (needs ``vlp serve --qa-model``)."""
        if answerer is None:
            raise ApiError(404, "no QA model loaded: start vlp serve with --qa-model")
        try:
            checked_text(body.question, "question", model.cfg.index.max_text_chars)
            if not 1 <= body.k <= MAX_K:
                raise ValueError(f"k must be an integer in 1..{MAX_K}, got {body.k}")
            answers = await model.run(answerer.answer, body.video_id, body.question, body.k)
        except KeyError:
            raise ApiError(404, f"the QA model has no clip {body.video_id!r}") from None
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return {"video_id": body.video_id, "question": body.question, "answers": answers}

    app.include_router(router)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    if token is not None:  # outside the body limit: a request without the token is refused before its body is read
        app.add_middleware(RequireToken, token=token)
    app.add_middleware(QueryText)  # outermost: a query string that is not text is refused before anything reads it


def log_client_errors_in_one_line(app: FastAPI) -> None:
    """KServe's own client errors on ``app`` (an invalid inference request: 400; an unknown model: 404) answered as
    KServe answers them, ``{"error": ...}``, but logged in one line, as the JSON API's are, not with a traceback.
    Call it after KServe has added its handlers (it replaces two of them)."""

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        return _respond(request, 400, str(exc))

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return _respond(request, 404, str(exc))

    app.add_exception_handler(InvalidInput, invalid)
    app.add_exception_handler(ModelNotFound, not_found)


def _respond(request: Request | None, status: int, message: str) -> JSONResponse:
    where = f"{request.method} {request.url.path}" if request is not None else "request"
    log.warning("%s: %d %s", where, status, message)
    return JSONResponse({"error": message}, status_code=status)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _respond(request, exc.status, exc.message)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's validation errors as one line: the first error's place and message."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    place = " ".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _respond(request, 422, f"{place}: {first.get('msg')}{more}" if place else f"{first.get('msg')}{more}")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (no such route: 404, a method it does not take: 405, a body that is not JSON where
    KServe reads one) as one line, ``{"error": ...}`` like every other refusal, not ``{"detail": ...}``."""
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail, default=str)
    response = _respond(request, exc.status_code, " ".join(detail.split()))
    response.headers.update(exc.headers or {})
    return response


class BodyLimit:
    """ASGI middleware: a request whose body is over ``limit`` bytes gets 413 before the app sees it (the body is
    read here, at most ``limit`` bytes of it, and handed on)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await self._too_large(scope, receive, send)
                return
        handed = False

        async def replay() -> dict[str, Any]:
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        log.warning("%s %s: 413 request body over %d bytes", scope.get("method"), scope.get("path"), self.limit)
        response = JSONResponse({"error": f"the request body is over {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)
