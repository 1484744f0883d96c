"""``vlp serve``: a model server for a clip index (docs/guides/serve.md), on KServe's Python SDK, so the same code is a
KServe InferenceService's custom predictor in Kubeflow and a local server.

- :mod:`vlp.serve.model`: the KServe model (``vlp-search``): the index's :class:`vlp.index.query.Searcher` behind
  the Open Inference Protocol (v2) and KServe's v1 protocol, and the :class:`~vlp.serve.model.Answerer` protocol a
  QA model meets.
- :mod:`vlp.serve.api`: the JSON API on the same app and port (search, thumbnails, answers, health).
- :mod:`vlp.serve.auth`: the token every route but the health probes needs, when ``VLP_SERVE_TOKEN`` is set.
- :mod:`vlp.serve.querystring`: every request's query string put through the text gate as the bytes that came.
- :mod:`vlp.serve.server`: binds the port, loads the models and runs KServe's REST server until SIGINT/SIGTERM.

Importing this package imports nothing else; its modules import KServe through :mod:`vlp.serve.sdk` (with an empty
command line: the SDK parses ``sys.argv`` when imported).
"""
