"""vlp's models as MLflow models of the ``python_function`` flavour: they load with ``mlflow.pyfunc.load_model`` and
serve with ``mlflow models serve`` (docs/guides/search.md, "MLflow").

Each is one directory that is two things at once: a copy of a vlp model directory (``model.json``, weights,
tokenizer: every vlp step and the re-evaluation read it as before) and an MLflow model (``MLmodel``) whose
``model_config`` holds the config it runs with (every section but ``storage`` and ``tracking``, which come from
the serving environment) and ``overrides``, ``section.key=value`` items applied on top at load time
(``mlflow.pyfunc.load_model(uri, model_config={"overrides": [...]})``, or MLflow's
``MLFLOW_PYFUNC_INFERENCE_CONFIG`` variable for ``mlflow models serve``), and whose ``PythonModel`` is pickled by
reference to this module: the environment that loads it must have vlp installed (the project's image;
``mlflow models serve --env-manager local``).

- :func:`save` (search): a retrieval model and a copy of an index it built (artifact ``index``). Loading opens the
  copied index with the model directory around it, whose weights must be the ones the index was built with
  (:class:`vlp.index.query.Searcher`). Input: a ``text`` column and an optional integer ``k`` (default 10), one
  query a row (a list of strings, or one ``{"text", "k"}`` mapping, is taken too). Output: one row a hit:
  ``query`` (the 0-based input row), ``rank``, ``video_id``, ``score`` (None where the clip was not re-ranked),
  ``similarity``, as ``vlp search`` returns them. Where the index stores no token features (ALPRO and ALBEF at
  their released sizes), the exact stage reads candidate clips from the frames store the index names.
- :func:`save_qa` (answers): a QA fine-tuned model and the frames store its clips are read from (``model_config``;
  none: a clip is a video file). Input: ``clip`` (a video id of that store, or a video file's path or ``s3://``
  URI), ``question`` and an optional integer ``k`` (default 5). Output: one row an answer: ``query``, ``rank``,
  ``answer``, ``probability``, as ``vlp answer`` returns them (:class:`vlp.index.answer.Answerer`).

The frames store and the object store must be reachable from where the model is served. A bad query (a missing
column, an empty text or question, ``k`` outside 1..1000, an unknown clip, an unreadable video file) is an
``MlflowException`` with ``INVALID_PARAMETER_VALUE``, which ``mlflow models serve`` answers with HTTP 400.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import mlflow.pyfunc
from mlflow.pyfunc import PythonModel

from vlp import __version__
from vlp.config import Config, _set_dotted, from_dict, parse_override, to_dict
from vlp.index.store import ClipIndex, fingerprint
from vlp.models import directory, family
from vlp.tracking import local_dir

COLUMNS = ["query", "rank", "video_id", "score", "similarity"]
QA_COLUMNS = ["query", "rank", "answer", "probability"]
DEFAULT_K = 10
DEFAULT_QA_K = 5
CARD = "vlp.json"  # the artifact every model has: what it is; its place locates the model directory around it


class SearchModel(PythonModel):
    """``vlp search`` as an MLflow ``PythonModel`` (see the module docstring for its input and output)."""

    def load_context(self, context: Any) -> None:
        # here: MLflow unpickles this class wherever the module is imported; torch and LanceDB load with the model
        from vlp.index.query import Searcher

        self.searcher = Searcher(context.artifacts["index"], _config(context), _root(context))

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them as a schema
        return _rows(rows(model_input, ["text"], DEFAULT_K), lambda r: self.searcher.search(r["text"], r["k"]), COLUMNS)


class AnswerModel(PythonModel):
    """``vlp answer`` as an MLflow ``PythonModel`` (see the module docstring for its input and output)."""

    def load_context(self, context: Any) -> None:
        # here: MLflow unpickles this class wherever the module is imported; torch loads with the model
        from vlp.index.answer import Answerer

        frames = (context.model_config or {}).get("frames", "")
        self.answerer = Answerer(_root(context), _config(context), frames=frames)

    def predict(self, context, model_input, params=None):  # no hints: MLflow would read them as a schema
        def one(row: dict[str, Any]) -> Any:
            return self.answerer.answer(row["clip"], row["question"], row["k"])

        return _rows(rows(model_input, ["clip", "question"], DEFAULT_QA_K), one, QA_COLUMNS)


PRIVATE = ("storage", "tracking")  # config sections never saved with a model: credentials and where things run


def _config(context: Any) -> Any:
    """The saved config (:func:`config_of`), with the ``overrides`` a loader passes in ``model_config`` on top; the
    ``storage`` and ``tracking`` sections from the serving environment (``AWS_*`` variables)."""

    settings = context.model_config or {}
    data = json.loads(json.dumps(settings.get("config", {})))
    for item in settings.get("overrides", []):
        _set_dotted(data, *parse_override(item))
    return from_dict(Config, data)


def config_of(cfg: Any) -> dict[str, Any]:
    """``cfg`` as the ``model_config`` of a saved model: every section but :data:`PRIVATE`."""

    return {k: v for k, v in to_dict(cfg).items() if k not in PRIVATE}


def _root(context: Any) -> str:
    """The model directory around the MLflow model: the card artifact lies at ``<root>/artifacts/<CARD>``."""
    return os.path.dirname(os.path.dirname(context.artifacts["card"]))


def _rows(found: list[dict[str, Any]], run: Callable[[dict[str, Any]], list[Any]], columns: list[str]) -> Any:
    """One output row per result of ``run`` on each input row, numbered by ``query``; a ``ValueError`` (a bad text,
    ``k``, clip or video file) is an invalid-parameter error naming the row."""
    import pandas as pd

    out = []
    for i, row in enumerate(found):
        try:
            results = run(row)
        except ValueError as exc:
            raise _bad_input(f"query {i}: {exc}") from None
        out += [{"query": i, **result.as_dict()} for result in results]
    return pd.DataFrame(out, columns=columns)


def rows(model_input: Any, needed: list[str], default_k: int) -> list[dict[str, Any]]:
    """Each query of ``model_input`` (a DataFrame, a list of strings for the first ``needed`` column, or one mapping)
    as ``{<needed>: str, "k": int}``.

    Raises:
        MlflowException: (INVALID_PARAMETER_VALUE) a ``needed`` column is missing or holds a non-string, or a ``k``
            is not an integer.
    """
    import pandas as pd

    if isinstance(model_input, dict):
        one = all(isinstance(model_input.get(name), str) for name in needed)
        model_input = pd.DataFrame([model_input] if one else model_input)
    elif isinstance(model_input, Sequence) and not isinstance(model_input, str):
        model_input = pd.DataFrame({needed[0]: list(model_input)})
    if not isinstance(model_input, pd.DataFrame) or not set(needed) <= set(model_input.columns):
        raise _bad_input(f"expected a table with the columns {', '.join(needed)} (and optionally k), one query a row")
    found = []
    for i, row in enumerate(model_input.to_dict("records")):
        for name in needed:
            if not isinstance(row[name], str):
                raise _bad_input(f"query {i}: `{name}` must be a string, got {row[name]!r}")
        k = row.get("k", default_k)
        if k is None or (isinstance(k, float) and k != k):  # a missing k in a table where other rows have one
            k = default_k
        if isinstance(k, bool) or not float(k).is_integer():
            raise _bad_input(f"query {i}: `k` must be an integer, got {k!r}")
        found.append({**{name: row[name] for name in needed}, "k": int(k)})
    return found


def _bad_input(message: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature(kind: str = "search") -> Any:
    """The input and output columns of the ``search`` or ``qa`` model."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    k = ColSpec("long", "k", required=False)
    if kind == "qa":
        inputs: list[Any] = [ColSpec("string", "clip"), ColSpec("string", "question"), k]
        outputs: list[Any] = [ColSpec("long", "query"), ColSpec("long", "rank"), ColSpec("string", "answer"),
                              ColSpec("double", "probability")]  # fmt: skip
    else:
        inputs = [ColSpec("string", "text"), k]
        outputs = [ColSpec("long", "query"), ColSpec("long", "rank"), ColSpec("string", "video_id"),
                   ColSpec("double", "score", required=False), ColSpec("double", "similarity")]  # fmt: skip
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def save(path: str, index: str, cfg: Any, model: str = "") -> str:
    """Write to the new local directory ``path`` a copy of the model directory that built the index ``index``
    (``model``, else the one the index names; local or ``s3://``) made into an MLflow model that searches a copy of
    that index with the config ``cfg`` (the one ``vlp search`` would take; its ``storage`` and ``tracking``
    sections are not saved). Returns ``path``.

    Raises:
        FileNotFoundError: no index at ``index``.
        FileExistsError: ``path`` exists.
        ValueError: ``model`` holds other weights than the index was built with.
    """
    # here: saving a model for MLflow imports no torch; the inference code is needed to load one
    from vlp.inference import retrieval_kinds

    built = ClipIndex.open(index).info
    source = model or built.model
    if fingerprint(directory.describe(source, retrieval_kinds())) != built.fingerprint:
        raise ValueError(f"the model directory {source} holds other weights than the index {index} was built with")
    card = {"kind": "search", "model": source, "index": index}
    with tempfile.TemporaryDirectory(prefix="vlp-pyfunc-") as tmp:
        artifacts = {"index": local_dir(index, os.path.join(tmp, "index"))}
        return _save(path, source, SearchModel(), card, artifacts, {"config": config_of(cfg), "overrides": []}, tmp)


def save_qa(path: str, model: str, cfg: Any, frames: str = "") -> str:
    """Write to the new local directory ``path`` a copy of the QA model directory ``model`` made into an MLflow
    model that answers questions about the clips of the frames store ``frames`` (none: clips are video files), with
    the config ``cfg`` (the one ``vlp answer`` would take; its ``storage`` and ``tracking`` sections are not saved).
    Returns ``path``.

    Raises:
        FileExistsError: ``path`` exists.
        ValueError: ``model`` is not a QA model.
    """
    # here: saving a model for MLflow imports no torch; the inference code is needed to load one
    from vlp.inference import qa_kinds

    family.qa_of(directory.describe(model, qa_kinds()).family)
    card = {"kind": "qa", "model": model, "frames": frames}
    with tempfile.TemporaryDirectory(prefix="vlp-pyfunc-") as tmp:
        settings = {"config": config_of(cfg), "overrides": [], "frames": frames}
        return _save(path, model, AnswerModel(), card, {}, settings, tmp)


def _save(path: str, source: str, python_model: PythonModel, card: dict[str, Any], artifacts: dict[str, str],
          model_config: dict[str, Any], tmp: str) -> str:  # fmt: skip
    """``source`` (a model directory) copied to ``path``, with the MLflow model of ``python_model`` beside it."""

    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: save the MLflow model into a new directory")
    card_file = os.path.join(tmp, CARD)
    with open(card_file, "w", encoding="utf-8") as f:
        json.dump(card, f, indent=2, sort_keys=True)
    staged = os.path.join(tmp, "mlflow")
    mlflow.pyfunc.save_model(
        staged,
        python_model=python_model,
        artifacts={"card": card_file, **artifacts},
        model_config=model_config,
        signature=signature(card["kind"]),
        pip_requirements=[f"vlp=={__version__}"],  # the project's image; not on PyPI: --env-manager local
        metadata={f"vlp.{k}": v for k, v in card.items()},
    )
    shutil.copytree(local_dir(source, os.path.join(tmp, "model")), path)
    for name in os.listdir(staged):  # MLmodel, python_model.pkl, artifacts/, the environment files
        if os.path.exists(os.path.join(path, name)):
            raise FileExistsError(f"the model directory {source} already has {name}: is it an MLflow model?")
        shutil.move(os.path.join(staged, name), os.path.join(path, name))
    return path
