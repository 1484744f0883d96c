"""KServe's Python SDK, imported with an empty command line.

``kserve.model_server`` parses ``sys.argv`` when it is imported (its own flags, unknown ones left alone), with
argparse's prefix matching: ``vlp serve --config FILE`` would be read as its ``--configure_logging FILE`` and end
the process. The server takes its settings from ``vlp serve``'s own options instead, so the SDK is imported here,
once, with ``sys.argv`` cut to the program name; every other module of :mod:`vlp.serve` imports it from here.
"""

from __future__ import annotations

import sys

_argv = sys.argv
sys.argv = _argv[:1]
try:
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.errors import InvalidInput, ModelNotFound
    from kserve.model_server import app
    from kserve.protocol.rest.server import RESTServer
finally:
    sys.argv = _argv

__all__ = [
    "FASTAPI_APP_IMPORT_STRING",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "InvalidInput",
    "Model",
    "ModelNotFound",
    "ModelServer",
    "RESTServer",
    "app",
]
