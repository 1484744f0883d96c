"""``vlp serve``: one process, one port, KServe's model server with the JSON API beside it.

The same code runs as a KServe InferenceService's custom predictor (``vlp serve --host 0.0.0.0 --port 8080``) and on
a workstation. KServe's REST server (uvicorn) serves its module-level FastAPI app, to which
:func:`vlp.serve.api.add_routes` adds the JSON API before it starts: the SDK's ``ModelServer`` keeps the model
registry and the data plane, its ``RESTServer`` the routes. ``ModelServer.start`` is not used: it binds every
address (``0.0.0.0``), opens a gRPC port unless told not to and installs signal handlers of its own. Here the
listening socket is bound first (a port in use is refused before the model loads), no gRPC server runs, and
uvicorn's graceful shutdown on SIGINT/SIGTERM hands the signal back to the CLI, which exits 130 or 143. KServe's
handlers of a bad inference request and an unknown model log a traceback each; the REST server here logs one line
instead (:func:`vlp.serve.api.log_client_errors_in_one_line`). With ``VLP_SERVE_TOKEN`` set, every route but the
health probes needs it (:mod:`vlp.serve.auth`); KServe's model-repository routes, which could only take the model
offline, are closed (:class:`NoModelRepository`); a request uvicorn cannot parse gets the same one-line JSON refusal
as every other (:class:`OneLineErrors`). uvicorn's access log keeps a line per request (method, path, status) but
never its query string, and no log line shows the token (:func:`private_logs`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from starlette.responses import JSONResponse
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from vlp.config import Config
from vlp.index.answer import Answerer as QA
from vlp.serve.api import add_routes, log_client_errors_in_one_line
from vlp.serve.auth import TOKEN_ENV, token_from
from vlp.serve.model import NAME, Answerer, SearchModel
from vlp.serve.sdk import FASTAPI_APP_IMPORT_STRING, ModelServer, RESTServer, app

log = logging.getLogger(__name__)


REPOSITORY_ROUTES = "/v2/repository/"  # KServe's model-repository extension: load and unload a model by name


class _RESTServer(RESTServer):
    """KServe's REST server, its client errors logged in one line, its OpenAPI spec without the model-repository
    routes (:class:`NoModelRepository` closes them)."""

    def _register_endpoints(self, app: Any) -> None:
        super()._register_endpoints(app)
        spec_of = app.openapi

        def spec() -> dict[str, Any]:
            found = spec_of()  # built once and cached by FastAPI: filtering it again changes nothing
            found["paths"] = {p: v for p, v in found["paths"].items() if not p.startswith(REPOSITORY_ROUTES)}
            return found

        app.openapi = spec

    def _add_exception_handlers(self, app: Any) -> None:
        super()._add_exception_handlers(app)
        log_client_errors_in_one_line(app)


class NoModelRepository:
    """ASGI middleware: KServe's model-repository routes (``/v2/repository/...``) answer 404, as a route that does
    not exist does.

    ``POST /v2/repository/models/{name}/unload`` takes the model out of the registry, after which every inference
    route is 404 and ``/load`` cannot bring a custom model like this one back (it reloads from a model directory
    KServe manages, which ``vlp serve`` has none of): its only use to a caller is to take the server offline. KServe
    mounts the routes whenever it mounts the v2 protocol, so they are closed here, in front of them; a new index is
    served by restarting (a rollout of the InferenceService)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(REPOSITORY_ROUTES):
            log.warning("%s %s: 404 not served (no model-repository routes)", scope.get("method"), scope.get("path"))
            await JSONResponse({"error": "Not Found"}, status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class OneLineErrors(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol, answering a request it cannot parse (a request line or header over its limits,
    bytes that are not HTTP) as every refusal of ``vlp serve`` is answered: 400 and ``{"error": ...}``, not
    plain text."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": f"not a valid HTTP request: {msg}"}).encode()
        log.warning("request: 400 not a valid HTTP request: %s", msg)
        head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        self.transport.close()


REDACTED = "<VLP_SERVE_TOKEN>"  # what a log line shows where it would show the token


class NoQueryString(logging.Filter):
    """On uvicorn's access log (``CLIENT - "METHOD PATH HTTP/V" STATUS``): the path without its query string, which
    holds search text and may hold a credential a client put there. Every request stays in the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):  # the path is the one argument that starts with "/"
            record.args = tuple(a.split("?", 1)[0] if isinstance(a, str) and a.startswith("/") else a
                                for a in record.args)  # fmt: skip
        return True


class Redacting(logging.Formatter):
    """A handler's formatter, each line it makes with the token replaced by :data:`REDACTED`, in every form a line
    may hold it: as sent, as uvicorn's access log quotes a path, as KServe's timing log names one (``/`` as ``.``),
    as ``repr`` shows it."""

    def __init__(self, inner: logging.Formatter, token: str) -> None:
        super().__init__()
        self.inner = inner
        forms = {token, quote(token), quote(token, safe=""), token.replace("/", "."), repr(token)[1:-1]}
        self.forms = sorted(forms, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        for form in self.forms:
            line = line.replace(form, REDACTED)
        return line


@contextmanager
def private_logs(token: str | None) -> Iterator[None]:
    """While it lasts, uvicorn's access log shows no query string (:class:`NoQueryString`) and, with a ``token``,
    every handler of every logger there is now writes it as :data:`REDACTED` (:class:`Redacting`): a client may put
    it in a path, which the access log and the one-line refusals show. Both are undone when it ends."""
    access, hide = logging.getLogger("uvicorn.access"), NoQueryString()
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    handlers = {h: h.formatter for lg in loggers for h in lg.handlers} if token is not None else {}
    access.addFilter(hide)
    for handler, formatter in handlers.items():
        handler.setFormatter(Redacting(formatter or logging.Formatter(), token or ""))
    try:
        yield
    finally:
        access.removeFilter(hide)
        for handler, formatter in handlers.items():
            handler.setFormatter(formatter)


class IndexAnswerer:
    """A QA model answering about the clips of an index (:class:`vlp.index.answer.Answerer` over the frames store
    the index names), in the shape ``POST /api/answer`` asks (:class:`vlp.serve.model.Answerer`)."""

    def __init__(self, qa_model: str, cfg: Config, index: str) -> None:

        self.qa = QA(qa_model, cfg, index=index)

    def answer(self, video_id: str, question: str, k: int) -> list[dict[str, Any]]:
        """The ``k`` most probable answers, ``{"answer", "probability"}`` each.

        Raises:
            KeyError: the index's frames store has no clip ``video_id``.
            ValueError: an empty question, or ``k`` outside 1..1000.
        """
        if self.qa.store is None or video_id not in self.qa.store:
            raise KeyError(video_id)
        return [{"answer": a.answer, "probability": a.probability} for a in self.qa.answer(video_id, question, k)]


def load_answerer(qa_model: str, cfg: Config, index: str) -> Answerer:
    """The QA model at ``qa_model``, loaded once, answering ``POST /api/answer`` about the clips of ``index``.

    Raises:
        ValueError: ``qa_model`` is not a QA model (the message names what to pass).
        StepInputError: the model directory or the index's frames store is missing.
    """
    return IndexAnswerer(qa_model, cfg, index)


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free one).

    Raises:
        ValueError: the address cannot be bound (in use, not this machine's, no such host).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(index: str, cfg: Config, qa_model: str = "", host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the index at ``index`` (and the QA model ``qa_model``, if given) on ``host:port`` until SIGINT or
    SIGTERM (the signal is raised again once the server has stopped: ``KeyboardInterrupt`` in the CLI). It returns
    only if the HTTP server stops on its own, which its startup failing does.

    Raises:
        ValueError: the address cannot be bound, ``VLP_SERVE_TOKEN`` is not a usable token, or the model or index
            is refused (:class:`Searcher`'s errors).
        FileNotFoundError: there is no index at ``index``.
    """
    token = token_from(os.environ)
    sock = listen(host, port)
    try:
        model = SearchModel(index, cfg, NAME)
        model.load()
        answerer = load_answerer(qa_model, cfg, index) if qa_model else None
        bound = sock.getsockname()[1]
        server = ModelServer(http_port=bound, enable_grpc=False)
        server.register_model(model)
        app.add_middleware(NoModelRepository)  # inside the token check that add_routes adds
        add_routes(app, model, answerer, token=token)
        rest = _RESTServer(FASTAPI_APP_IMPORT_STRING, server.dataplane, server.model_repository_extension, bound)
        rest.config.host = host  # uvicorn serves the socket bound above; this is what its log says
        rest.config.http = OneLineErrors
        if token is None and not ipaddress.ip_address(sock.getsockname()[0]).is_loopback:
            log.warning("vlp serve: %s is unset: anyone who reaches %s can search%s (docs/guides/serve.md: Access)",
                        TOKEN_ENV, host, " and ask" if answerer else "")  # fmt: skip
        url = f"http://[{host}]:{bound}" if ":" in host else f"http://{host}:{bound}"
        log.info("vlp serve: listening on %s (model %s; %s/v2/models/%s/infer, %s/api/search?q=...)", url, NAME,
                 url, NAME, url)  # fmt: skip
        with private_logs(token):
            rest.run(sockets=[sock])
    finally:
        sock.close()
    # uvicorn stops on SIGINT even where it was ignored when it started (a job started in the background, where
    # the CLI leaves it ignored) and raises it again into that ignoring handler: a stop all the same
    if signal.SIGINT in getattr(getattr(rest, "_server", None), "_captured_signals", ()):
        raise KeyboardInterrupt
