"""A clip index and its model as an MLflow model of the ``python_function`` flavour: it loads with
``mlflow.pyfunc.load_model`` and serves with ``mlflow models serve`` (docs/search.md, "MLflow").

:func:`save` writes one directory that is both things at once: a copy of the model directory that built the index
(``model.json``, weights, tokenizer: every vlp step and the re-evaluation read it as before) and an MLflow model
(``MLmodel``) whose artifact ``index`` is a copy of the index, with the config overrides a search uses
(``model_config``) and :class:`SearchModel`, pickled by reference to this module: the environment that loads it
must have vlp installed (the project's image; ``mlflow models serve --env-manager local``). Loading opens the copied
index with the model directory around it, whose weights must be the ones the index was built with
(:class:`vlp.index.query.Searcher`). Where the
index stores no token features (ALPRO and ALBEF at their released sizes), the exact stage of a search reads
candidate clips from the frames store the index names, so that store must be reachable from where the model is
served.

Input: a table (pandas DataFrame; ``dataframe_records`` / ``dataframe_split`` over HTTP) with a ``text`` column and
an optional integer ``k`` column (default 10), one query a row; a list of strings or a ``{"text": ..., "k": ...}``
mapping is taken too. Output: a DataFrame with one row a hit: ``query`` (the 0-based input row), ``rank``,
``video_id``, ``score`` (None where the clip was not re-ranked) and ``similarity``, as :meth:`Searcher.search`
returns them. A bad query (empty text, ``k`` outside 1..1000, no ``text``) is an ``MlflowException`` with
``INVALID_PARAMETER_VALUE``, which ``mlflow models serve`` answers with HTTP 400.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import mlflow.pyfunc
from mlflow.pyfunc import PythonModel

COLUMNS = ["query", "rank", "video_id", "score", "similarity"]
DEFAULT_K = 10


class SearchModel(PythonModel):
    """``vlp search`` as an MLflow ``PythonModel`` (see the module docstring for its input and output)."""

    def load_context(self, context: Any) -> None:
        from vlp.config import load_config
        from vlp.index.query import Searcher

        overrides = list((context.model_config or {}).get("overrides", []))
        index = context.artifacts["index"]
        root = os.path.dirname(os.path.dirname(index))  # <root>/artifacts/index: the model directory is <root>
        self.searcher = Searcher(index, load_config(None, overrides), root)

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them as a schema
        import pandas as pd

        rows = []
        for i, (text, k) in enumerate(queries(model_input)):
            try:
                hits = self.searcher.search(text, k)
            except ValueError as exc:
                raise _bad_input(f"query {i}: {exc}") from None
            rows += [{"query": i, **hit.as_dict()} for hit in hits]
        return pd.DataFrame(rows, columns=COLUMNS)


def queries(model_input: Any) -> list[tuple[str, int]]:
    """``(text, k)`` of each query in ``model_input`` (a DataFrame, a list of strings, or one mapping).

    Raises:
        MlflowException: (INVALID_PARAMETER_VALUE) no ``text``, a text that is not a string, or a ``k`` that is not
            an integer.
    """
    import pandas as pd

    if isinstance(model_input, dict):
        model_input = pd.DataFrame([model_input] if isinstance(model_input.get("text"), str) else model_input)
    elif isinstance(model_input, Sequence) and not isinstance(model_input, str):
        model_input = pd.DataFrame({"text": list(model_input)})
    if not isinstance(model_input, pd.DataFrame) or "text" not in model_input.columns:
        raise _bad_input("expected a table with a `text` column (and optionally `k`), one query a row")
    found = []
    for i, row in enumerate(model_input.to_dict("records")):
        text, k = row["text"], row.get("k", DEFAULT_K)
        if not isinstance(text, str):
            raise _bad_input(f"query {i}: `text` must be a string, got {text!r}")
        if k is None or (isinstance(k, float) and k != k):  # a missing k in a table where other rows have one
            k = DEFAULT_K
        if isinstance(k, bool) or not float(k).is_integer():
            raise _bad_input(f"query {i}: `k` must be an integer, got {k!r}")
        found.append((text, int(k)))
    return found


def _bad_input(message: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature() -> Any:
    """Input ``text`` (string) and optional ``k`` (long); output the hit columns."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    hits: list[Any] = [ColSpec("long", "query"), ColSpec("long", "rank"), ColSpec("string", "video_id"),
            ColSpec("double", "score", required=False), ColSpec("double", "similarity")]  # fmt: skip
    queries: list[Any] = [ColSpec("string", "text"), ColSpec("long", "k", required=False)]
    return ModelSignature(inputs=Schema(queries), outputs=Schema(hits))


def save(path: str, index: str, overrides: Sequence[str] = (), model: str = "") -> str:
    """Write to the new local directory ``path`` a copy of the model directory that built the index ``index``
    (``model``, else the one the index names; local or ``s3://``) made into an MLflow model of that index, searched
    with the config ``overrides``. Returns ``path``.

    Raises:
        FileNotFoundError: no index at ``index``.
        FileExistsError: ``path`` exists.
        ValueError: ``model`` holds other weights than the index was built with.
    """
    from vlp import __version__, storage
    from vlp.index.store import ClipIndex, fingerprint
    from vlp.models import directory
    from vlp.steps.evaluate import retrieval_kinds
    from vlp.tracking import local_dir

    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: save the MLflow model into a new directory")
    built = ClipIndex.open(index).info
    source = model or built.model
    if fingerprint(directory.describe(source, retrieval_kinds())) != built.fingerprint:
        raise ValueError(f"the model directory {source} holds other weights than the index {index} was built with")
    with tempfile.TemporaryDirectory(prefix="vlp-pyfunc-") as tmp:
        staged = os.path.join(tmp, "mlflow")
        mlflow.pyfunc.save_model(
            staged,
            python_model=SearchModel(),
            artifacts={"index": local_dir(index, os.path.join(tmp, "index"))},
            model_config={"overrides": list(overrides)},
            signature=signature(),
            pip_requirements=[f"vlp=={__version__}"],  # the project's image; not on PyPI: --env-manager local
            metadata={"vlp.index": index if storage.is_s3(index) else os.path.abspath(index), "vlp.model": source},
        )
        shutil.copytree(local_dir(source, os.path.join(tmp, "model")), path)
        for name in os.listdir(staged):  # MLmodel, python_model.pkl, artifacts/, the environment files
            if os.path.exists(os.path.join(path, name)):
                raise FileExistsError(f"the model directory {source} already has {name}: is it an MLflow model?")
            shutil.move(os.path.join(staged, name), os.path.join(path, name))
    return path
