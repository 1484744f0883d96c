"""A model directory: one trained (or imported) model, and the only code that reads or writes one.

Every training step writes one, ``vlp import-checkpoint`` makes one from released weights, and every step
that starts from a model (fine-tuning, evaluation, the prompt bank, PEM) reads one through :func:`describe`
or :func:`load`. Layout (local path or ``s3://`` prefix)::

    model.json            what the model is: format, family, kind, config, checkpoint, lineage
    tokenizer/            the tokenizer its token ids belong to (transformers' save_pretrained layout)
    <checkpoint>/model.safetensors
                          the weights: a training checkpoint (``checkpoints/step-000500``) or, for an
                          imported model, ``weights/``
    answers.json          the answer vocabulary, in classifier order (QA kinds only)

``model.json`` keys: ``format`` (this module's :data:`FORMAT`), ``family`` (``alpro``; see
:mod:`vlp.models.family`), ``kind`` (one of the family's kinds, e.g. ALPRO's ``prompter``, ``alpro``,
``alpro_retrieval``, ``alpro_qa``), ``config`` (the model config as a
dict; the towers' ``init`` is kept as lineage, never re-fetched: the weights come from the checkpoint),
``checkpoint`` (relative to the directory, and it must stay inside it), ``lineage`` (where the model came
from: the directory it was trained from, an imported file and its SHA-256, and ``upstream``, below) and task
entries (``steps``, ``entities``, ``max_len``, ``answers``). Directories written before ``format``/``family``
existed read as format 1 of the ALPRO family.

``lineage.upstream`` says exactly which outside weights the model started from, one record per source:
``video`` / ``text`` for the towers' ``init`` (hub weights: ``{"source", "repo", "revision", "commit",
"file"}``, the commit the revision resolved to when they were loaded; a local or ``s3://`` file: ``{"source",
"sha256"}`` of the file read, with ``file`` when ``source`` is a directory; timm URL weights: ``{"source",
"url"}``) and ``tokenizer`` for a tokenizer that came from the hub
(its repo, revision and commit, also kept in ``tokenizer/upstream.json``). A model trained from another model
directory (``lineage.pretrained``) carries that directory's records on. Absent when nothing came from outside
(random init, a tokenizer trained on the captions or read from a directory, which the model directory holds).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from vlp import storage
from vlp.data import manifest
from vlp.models import family as families

MODEL_JSON = "model.json"
TOKENIZER_DIR = "tokenizer"
ANSWERS_FILE = "answers.json"
FORMAT = 1


# The command that makes a model of each role (for the errors that ask for one).
_MADE_BY = {
    "prompter": "vlp pretrain-prompter",
    "pretrained": "vlp pretrain",
    "retrieval": "vlp finetune-retrieval",
    "qa": "vlp finetune-qa",
}


def made_by(kind: str) -> str:
    """The command that writes a model of ``kind`` ("" for an unknown kind)."""

    try:
        kinds = families.of_kind(kind).kinds
    except ValueError:
        return ""
    return next(_MADE_BY[role] for role, k in kinds._asdict().items() if k == kind)


def is_qa(kind: str) -> bool:
    """Whether ``kind`` is a family's QA kind (a model with an answer vocabulary)."""

    return families.of_kind(kind).kinds.qa == kind


@dataclass(frozen=True)
class ModelDir:
    """What :func:`describe` read from a model directory (no weights loaded).

    Attributes:
        uri: the directory.
        kind: the model's kind (one of its family's :class:`vlp.models.family.Kinds`).
        family: its family (:class:`vlp.models.family.Family`).
        config: the family's config object, towers' ``init`` cleared (the weights come from ``checkpoint``).
        checkpoint: absolute URI of the directory that holds ``model.safetensors``.
        doc: the whole ``model.json`` (lineage and task entries).
    """

    uri: str
    kind: str
    family: Any
    config: Any
    checkpoint: str
    doc: dict[str, Any] = field(repr=False)

    @property
    def tokenizer_dir(self) -> str:
        return storage.join(self.uri, TOKENIZER_DIR)

    def tokenizer(self) -> Any:
        """The model's tokenizer (its vocabulary size checked against the text tower's)."""
        # here: model.json is read without torch (the CLI, the inputs checks); saving and loading need it
        from vlp.models.tokenizer import load_tokenizer

        tok = load_tokenizer(self.tokenizer_dir)
        check_vocab(tok, self.config, self.tokenizer_dir)
        return tok

    def text_ids(self) -> Any:
        """The model's tokenizer as inference uses it, texts to ids and mask
        (:func:`vlp.models.tokenizer.load_text_ids`: without transformers for a tokenizer vlp trained), its vocabulary
        size checked."""
        from vlp.models.tokenizer import load_text_ids  # see tokenizer()

        tok = load_text_ids(self.tokenizer_dir)
        check_vocab(tok, self.config, self.tokenizer_dir)
        return tok

    def answers(self) -> list[str]:
        """The QA answer vocabulary, in classifier order."""
        if not is_qa(self.kind):
            raise ValueError(f"{self.uri} holds a {self.kind!r} model, which has no answer vocabulary")
        return json.loads(storage.read_text(storage.join(self.uri, self.doc.get("answers", ANSWERS_FILE))))

    def build(self) -> Any:
        """A randomly initialised module of this kind and config (the weights are :meth:`load`'s job)."""
        answers = len(self.answers()) if is_qa(self.kind) else 0
        return self.family.build(self.kind, self.config, answers)

    def load(self, device: Any = None) -> Any:
        """The module with its weights, in eval mode, on ``device`` (default: where it was built)."""
        from vlp.weights import load_model_weights  # here: reading model.json alone must not import torch

        module = self.build()
        load_model_weights(self.checkpoint, module)
        if device is not None:
            module.to(device)
        return module.eval()


def check_vocab(tokenizer: Any, config: Any, where: str) -> None:
    """Refuse a tokenizer with more tokens than ``config``'s text tower has embeddings (its ids would index past
    them); ``where`` names the tokenizer in the message."""
    vocab = getattr(getattr(config, "text", None), "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer {where} has {len(tokenizer)} tokens but the model's text tower has {vocab} embeddings: "
            "use the tokenizer the weights were trained with"
        )


def describe(uri: str, kinds: tuple[str, ...] | None = None) -> ModelDir:
    """Read and check ``<uri>/model.json``; with ``kinds``, the model must be one of them.

    Raises:
        FileNotFoundError: ``uri`` is not a model directory.
        ValueError: an unknown format or kind, a kind not in ``kinds``, or no checkpoint (the step that wrote
            it did not finish).
        ManifestError: the checkpoint path leaves the directory.
        LinkError: the directory holds a symbolic link (:func:`vlp.storage.refuse_links`).
    """

    doc_uri = storage.join(uri, MODEL_JSON)
    if not storage.exists(doc_uri):
        raise FileNotFoundError(
            f"{doc_uri} does not exist: pass the output of `vlp pretrain`, `vlp finetune-*` or `vlp import-checkpoint`"
        )
    storage.refuse_links(uri, "model directory")
    doc = json.loads(storage.read_text(doc_uri))
    if doc.get("format", FORMAT) != FORMAT:
        raise ValueError(f"{doc_uri}: model directory format {doc.get('format')!r}; this vlp reads format {FORMAT}")
    kind = doc.get("kind")
    family = families.of_kind(kind)
    if doc.get("family", family.name) != family.name:
        raise ValueError(f"{doc_uri}: kind {kind!r} belongs to family {family.name!r}, not {doc.get('family')!r}")
    if kinds is not None and kind not in kinds:
        wanted = ", ".join(f"{k} (`{made_by(k)}`)" if made_by(k) else k for k in kinds)
        raise ValueError(f"{uri} holds a {kind!r} model; this step needs one of: {wanted}")
    if not doc.get("checkpoint"):
        raise ValueError(f"{doc_uri} names no checkpoint: the step that wrote it did not finish")
    try:
        checkpoint = manifest.resolve_inside(uri, doc["checkpoint"])
    except manifest.BadPathError as exc:  # outside the directory, or a name no OS call takes (a NUL byte)
        raise type(exc)(f"{doc_uri}: checkpoint: {exc}") from None
    return ModelDir(uri, kind, family, family.config_from_dict(doc["config"]), checkpoint, doc)


def load(uri: str, kinds: tuple[str, ...] | None = None, device: Any = None) -> tuple[Any, Any, ModelDir]:
    """``(module in eval mode with its weights, tokenizer, ModelDir)`` of the model directory ``uri``."""
    info = describe(uri, kinds)
    return info.load(device), info.tokenizer(), info


def save_tokenizer_once(tokenizer: Any, out: str) -> None:
    """Save ``tokenizer`` as ``<out>/tokenizer`` unless one is there already (rank 0 only)."""
    # here: model.json is read without torch (the CLI, the inputs checks); saving and loading need it
    from vlp import distributed
    from vlp.models.tokenizer import save_tokenizer

    target = storage.join(out, TOKENIZER_DIR)
    if distributed.rank() == 0 and not storage.exists(storage.join(target, "tokenizer.json")):
        save_tokenizer(tokenizer, target)


def save(
    out: str,
    *,
    kind: str,
    config: Any,
    checkpoint: str | None,
    tokenizer: Any = None,
    answers: list[str] | None = None,
    lineage: dict[str, Any] | None = None,
    **entries: Any,
) -> None:
    """Write ``<out>/model.json`` (and the tokenizer and answers when given); rank 0 only, others return.

    Args:
        out: the model directory.
        kind: the model's kind; its family is looked up.
        config: the model config (a dataclass).
        checkpoint: the directory that holds ``model.safetensors``: inside ``out`` (stored relative) .
        tokenizer: saved as ``<out>/tokenizer`` unless one is there.
        answers: the QA answer vocabulary (QA kinds), written to ``answers.json``.
        lineage: where the model came from; ``upstream`` is added (:func:`upstream_lineage`).
        entries: task entries (``steps``, ``max_len``, ...), stored as top-level keys.

    Raises:
        RuntimeError: there is no checkpoint (training finished without one).
        ValueError: the checkpoint is outside ``out``, or answers are missing for a QA kind.
    """
    # here: model.json is read without torch (the CLI, the inputs checks); saving and loading need it
    from vlp import distributed

    family = families.of_kind(kind)
    if distributed.rank() != 0:
        return
    if checkpoint is None:
        raise RuntimeError(f"training into {out} finished without a checkpoint to point {MODEL_JSON} at")
    root = out.rstrip("/") + "/"
    if not checkpoint.startswith(root):
        raise ValueError(f"the checkpoint {checkpoint} is not inside the model directory {out}")
    if is_qa(kind) != (answers is not None):
        raise ValueError(f"a {kind!r} model {'needs' if is_qa(kind) else 'has no'} answer vocabulary")
    if tokenizer is not None:
        save_tokenizer_once(tokenizer, out)
    upstream = upstream_lineage(config, tokenizer, (lineage or {}).get("pretrained", ""))
    lineage = dict(lineage or {}) | ({"upstream": upstream} if upstream else {})
    doc: dict[str, Any] = {
        "format": FORMAT,
        "family": family.name,
        "kind": kind,
        "config": dataclasses.asdict(config),
        "checkpoint": checkpoint[len(root) :],
        **({"lineage": lineage} if lineage else {}),
        **entries,
    }
    if answers is not None:
        storage.write_text(storage.join(out, ANSWERS_FILE), json.dumps(answers, indent=0) + "\n")
        doc["answers"] = ANSWERS_FILE
    storage.write_text(storage.join(out, MODEL_JSON), json.dumps(doc, indent=2, sort_keys=True) + "\n")


def upstream_lineage(config: Any, tokenizer: Any = None, pretrained: str = "") -> dict[str, dict[str, str]]:
    """The outside weights a model of ``config`` started from (``lineage.upstream``, see the module docstring).

    Args:
        config: the model config; its ``video`` / ``text`` towers' ``init`` and ``init_revision`` name them, and
            :func:`vlp.models.tokenizer.upstream_of` says what they resolved to when this process loaded them.
        tokenizer: the model's tokenizer; recorded when it came from the hub.
        pretrained: the model directory this one was trained from, whose records are carried on where this
            config names no weights of its own.
    """
    # here: model.json is read without torch (the CLI, the inputs checks); saving and loading need it
    from vlp.models.tokenizer import tokenizer_upstream, upstream_of

    records: dict[str, dict[str, str]] = {}
    if pretrained and storage.exists(storage.join(pretrained, MODEL_JSON)):
        start = json.loads(storage.read_text(storage.join(pretrained, MODEL_JSON)))
        records |= start.get("lineage", {}).get("upstream", {})
    for tower in ("video", "text"):
        part = getattr(config, tower, None)
        if init := getattr(part, "init", ""):
            records[tower] = upstream_of(init, getattr(part, "init_revision", ""))
    own = tokenizer_upstream(tokenizer) if tokenizer is not None else None
    if own:
        records["tokenizer"] = own
    return records
