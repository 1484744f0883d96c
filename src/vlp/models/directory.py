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

``model.json`` keys: ``format`` (this module's :data:`FORMAT`), ``family`` (``alpro``), ``kind`` (one of the
family's kinds: ``prompter``, ``alpro``, ``alpro_retrieval``, ``alpro_qa``), ``config`` (the model config as a
dict; the towers' ``init`` is kept as lineage, never re-fetched: the weights come from the checkpoint),
``checkpoint`` (relative to the directory, and it must stay inside it), ``lineage`` (where the model came
from: the directory it was trained from, an imported file and its SHA-256) and task entries (``steps``,
``entities``, ``max_len``, ``answers``). Directories written before ``format``/``family`` existed read as
format 1 of the ALPRO family.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vlp import storage

MODEL_JSON = "model.json"
TOKENIZER_DIR = "tokenizer"
ANSWERS_FILE = "answers.json"
FORMAT = 1


@dataclass(frozen=True)
class Family:
    """How a model family turns a ``model.json`` into a module.

    Attributes:
        name: the family (``model.json``'s ``family``).
        kinds: the kinds of model it has, e.g. pre-trained, retrieval- and QA-fine-tuned.
        config_from_dict: ``model.json``'s ``config`` -> the family's config object (``init`` cleared).
        build: ``(kind, config, num_answers)`` -> a randomly initialised module of that kind.
    """

    name: str
    kinds: tuple[str, ...]
    config_from_dict: Callable[[dict[str, Any]], Any]
    build: Callable[[str, Any, int], Any]


def _alpro_config(data: dict[str, Any]) -> Any:
    from vlp.models.alpro import AlproConfig

    return AlproConfig.from_dict(data)


def _alpro_build(kind: str, config: Any, num_answers: int) -> Any:
    from vlp.models.alpro import Alpro, AlproQA, DualEncoder

    if kind == "prompter":
        return DualEncoder(config.video, config.text, embed_dim=config.embed_dim, init_temp=config.init_temp)
    if kind == "alpro_qa":
        return AlproQA(config, num_answers)
    return Alpro(config)


FAMILIES: dict[str, Family] = {
    "alpro": Family("alpro", ("prompter", "alpro", "alpro_retrieval", "alpro_qa"), _alpro_config, _alpro_build),
}
QA_KINDS = ("alpro_qa",)
# The command that makes a model of each kind (for the errors that ask for one).
MADE_BY = {
    "prompter": "vlp pretrain-prompter",
    "alpro": "vlp pretrain",
    "alpro_retrieval": "vlp finetune-retrieval",
    "alpro_qa": "vlp finetune-qa",
}


def family_of(kind: str) -> Family:
    """The family that has models of ``kind``."""
    for family in FAMILIES.values():
        if kind in family.kinds:
            return family
    known = sorted(k for f in FAMILIES.values() for k in f.kinds)
    raise ValueError(f"unknown model kind {kind!r}; known kinds: {known}")


@dataclass(frozen=True)
class ModelDir:
    """What :func:`describe` read from a model directory (no weights loaded).

    Attributes:
        uri: the directory.
        kind: the model's kind (see :data:`FAMILIES`).
        family: its family.
        config: the family's config object, towers' ``init`` cleared (the weights come from ``checkpoint``).
        checkpoint: absolute URI of the directory that holds ``model.safetensors``.
        doc: the whole ``model.json`` (lineage and task entries).
    """

    uri: str
    kind: str
    family: Family
    config: Any
    checkpoint: str
    doc: dict[str, Any] = field(repr=False)

    @property
    def tokenizer_dir(self) -> str:
        return storage.join(self.uri, TOKENIZER_DIR)

    def tokenizer(self) -> Any:
        """The model's tokenizer (its vocabulary size checked against the text tower's)."""
        from vlp.models.tokenizer import load_tokenizer

        tok = load_tokenizer(self.tokenizer_dir)
        check_vocab(tok, self.config, self.tokenizer_dir)
        return tok

    def answers(self) -> list[str]:
        """The QA answer vocabulary, in classifier order."""
        if self.kind not in QA_KINDS:
            raise ValueError(f"{self.uri} holds a {self.kind!r} model, which has no answer vocabulary")
        return json.loads(storage.read_text(storage.join(self.uri, self.doc.get("answers", ANSWERS_FILE))))

    def build(self) -> Any:
        """A randomly initialised module of this kind and config (the weights are :meth:`load`'s job)."""
        answers = len(self.answers()) if self.kind in QA_KINDS else 0
        return self.family.build(self.kind, self.config, answers)

    def load(self, device: Any = None) -> Any:
        """The module with its weights, in eval mode, on ``device`` (default: where it was built)."""
        from vlp.train.checkpoint import load_model_weights

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
    """
    from vlp.data import manifest

    doc_uri = storage.join(uri, MODEL_JSON)
    if not storage.exists(doc_uri):
        raise FileNotFoundError(
            f"{doc_uri} does not exist: pass the output of `vlp pretrain`, `vlp finetune-*` or `vlp import-checkpoint`"
        )
    doc = json.loads(storage.read_text(doc_uri))
    if doc.get("format", FORMAT) != FORMAT:
        raise ValueError(f"{doc_uri}: model directory format {doc.get('format')!r}; this vlp reads format {FORMAT}")
    kind = doc.get("kind")
    family = family_of(kind)
    if doc.get("family", family.name) != family.name:
        raise ValueError(f"{doc_uri}: kind {kind!r} belongs to family {family.name!r}, not {doc.get('family')!r}")
    if kinds is not None and kind not in kinds:
        wanted = ", ".join(f"{k} (`{MADE_BY[k]}`)" if k in MADE_BY else k for k in kinds)
        raise ValueError(f"{uri} holds a {kind!r} model; this step needs one of: {wanted}")
    if not doc.get("checkpoint"):
        raise ValueError(f"{doc_uri} names no checkpoint: the step that wrote it did not finish")
    checkpoint = manifest.resolve_inside(uri, doc["checkpoint"])
    return ModelDir(uri, kind, family, family.config_from_dict(doc["config"]), checkpoint, doc)


def load(uri: str, kinds: tuple[str, ...] | None = None, device: Any = None) -> tuple[Any, Any, ModelDir]:
    """``(module in eval mode with its weights, tokenizer, ModelDir)`` of the model directory ``uri``."""
    info = describe(uri, kinds)
    return info.load(device), info.tokenizer(), info


def save_tokenizer_once(tokenizer: Any, out: str) -> None:
    """Save ``tokenizer`` as ``<out>/tokenizer`` unless one is there already (rank 0 only)."""
    from vlp.models.tokenizer import save_tokenizer
    from vlp.train import distributed

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
        lineage: where the model came from.
        entries: task entries (``steps``, ``max_len``, ...), stored as top-level keys.

    Raises:
        RuntimeError: there is no checkpoint (training finished without one).
        ValueError: the checkpoint is outside ``out``, or answers are missing for a QA kind.
    """
    from vlp.train import distributed

    family = family_of(kind)
    if distributed.rank() != 0:
        return
    if checkpoint is None:
        raise RuntimeError(f"training into {out} finished without a checkpoint to point {MODEL_JSON} at")
    root = out.rstrip("/") + "/"
    if not checkpoint.startswith(root):
        raise ValueError(f"the checkpoint {checkpoint} is not inside the model directory {out}")
    if (kind in QA_KINDS) != (answers is not None):
        raise ValueError(f"a {kind!r} model {'needs' if kind in QA_KINDS else 'has no'} answer vocabulary")
    if tokenizer is not None:
        save_tokenizer_once(tokenizer, out)
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
