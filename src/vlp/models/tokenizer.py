"""BERT-style WordPiece tokenizer: trained from a corpus when no hub access, saved and loaded as an artifact.

The paper's text encoder uses ``bert-base-uncased``'s tokenizer. Without network access (tests, the embedded
synthetic world) :func:`train_wordpiece` builds a tokenizer of the same kind from the captions: the
``tokenizers`` library's BERT normaliser (clean text, CJK spacing, lowercase + strip accents) and BERT
pre-tokeniser (whitespace and punctuation), a WordPiece vocabulary with ``##`` continuation prefix learnt
deterministically (:func:`wordpiece_vocab`), and a template post-processor that adds ``[CLS] ... [SEP]``.
Special token ids differ from bert-base-uncased's (there [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102,
[MASK]=103); here they are the first five ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. [PAD]=0 in
both keeps BERT's ``padding_idx`` convention.

:func:`save_tokenizer` / :func:`load_tokenizer` move the tokenizer through vlp.storage URIs (local paths and
``s3://``); :func:`load_tokenizer` also accepts a hub name (and a revision) when the hub is reachable (or
cached), and raises :class:`PretrainedUnavailableError` with a remedy when it is not.
Without network, huggingface_hub retries for tens of seconds before giving up; set ``HF_HUB_OFFLINE=1`` in
air-gapped environments to fail (or use the local cache) at once.

This module also holds what every hub download of the models shares. A revision (branch, tag or commit;
``""`` = the default branch, ``main``) is first resolved to its commit (:func:`resolve_hub_revision`: by the
hub or, offline, by the local cache's ``refs/``) and the files are fetched at that commit
(:func:`hub_download`), so what is loaded is exactly what is recorded. Each weight loader records where its
weights came from (:func:`remember_upstream`: hub repo, revision and commit, or a local file's SHA-256), and
:func:`vlp.models.directory.save` writes those records into the model directory's ``lineage.upstream``. A
tokenizer loaded from the hub carries its own record (:func:`tokenizer_upstream`), which
:func:`save_tokenizer` keeps beside its files (``upstream.json``) so that it survives a save and a load.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from vlp import storage

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in this order
CONTINUATION = "##"  # WordPiece marks a piece that continues a word
UPSTREAM_FILE = "upstream.json"  # in a saved tokenizer directory: the hub repo and commit it came from
_UPSTREAM_ATTR = "vlp_upstream"  # the same record, on a tokenizer object
log = logging.getLogger("vlp")


class PretrainedUnavailableError(OSError):
    """A pretrained artifact (tokenizer or weights) named by hub id or path could not be found or fetched."""


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``).

    The environment is read at call time (huggingface_hub reads it once at import), so tests and steps
    can switch it on with ``monkeypatch.setenv`` / the container environment.
    """
    truthy = {"1", "on", "yes", "true"}
    env = any(os.environ.get(k, "").strip().lower() in truthy for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    try:
        from huggingface_hub import constants

        return env or bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return env


def looks_like_path(name: str) -> bool:
    """True when ``name`` is meant as a path/URI rather than a hub id (``org/name`` is a hub id)."""
    return storage.is_absolute(name) or name.startswith(("./", "../", "~")) or os.path.exists(name)


# --------------------------------------------------------------------------- hub revisions and upstream records


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, from the environment at call time: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    huggingface_hub's default (which it reads once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def check_no_revision(source: str, revision: str) -> None:
    """Refuse a revision for a local path or ``s3://`` URI: only hub names have revisions."""
    if revision:
        raise ValueError(
            f"revision {revision!r} was given for {source!r}, which is a path, not a hub name: clear the revision "
            "(a local file is recorded by its SHA-256) or name a hub repository"
        )


def resolve_hub_revision(repo: str, revision: str = "", *, what: str, remedy: str) -> str:
    """The commit sha that ``revision`` of the hub model ``repo`` names, asking the hub, or offline
    (``HF_HUB_OFFLINE``) the local cache's ``refs/``.

    Args:
        repo: hub model id (``bert-base-uncased``, ``openai/clip-vit-base-patch32``).
        revision: branch, tag or commit sha; ``""`` = the default branch (``main``).
        what: what is being loaded, for the error message (``"tokenizer"``).
        remedy: what the user can do instead, appended to the error message.

    Raises:
        PretrainedUnavailableError: the revision does not exist, or the hub is unreachable and the local cache
            does not have it (the message lists the revisions it has).
    """
    from huggingface_hub import resolve_revision

    try:
        found = resolve_revision(
            repo, revision=revision or None, cache_dir=hub_cache_dir(), local_files_only=hub_offline()
        )
    except Exception as exc:  # hub errors are many types (offline, 404, auth, connection)
        raise _hub_error(what, repo, revision, exc, remedy) from exc
    return str(found.resolved)


def hub_download(
    repo: str, filenames: tuple[str, ...], revision: str = "", *, what: str, remedy: str
) -> tuple[str, dict[str, str]]:
    """The first of ``filenames`` that the hub model ``repo`` has at ``revision``, fetched (or taken from the
    cache) at the commit the revision resolves to.

    Returns:
        ``(local path, record)``; the record is ``{"repo", "revision", "commit", "file"}`` (revision ``""`` is
        recorded as ``main``, the branch huggingface_hub asks for).

    Raises:
        PretrainedUnavailableError: as :func:`resolve_hub_revision`, or the commit holds none of ``filenames``.
    """
    from huggingface_hub import constants, hf_hub_download

    commit = resolve_hub_revision(repo, revision, what=what, remedy=remedy)
    errors: list[str] = []
    for fname in filenames:
        try:
            path = hf_hub_download(
                repo, fname, revision=commit, cache_dir=hub_cache_dir(), local_files_only=hub_offline()
            )
        except Exception as exc:  # a missing file is an EntryNotFoundError, an unreachable hub another type
            errors.append(f"{fname}: {type(exc).__name__}")
            continue
        return path, {"repo": repo, "revision": revision or constants.DEFAULT_REVISION, "commit": commit, "file": fname}
    raise _hub_error(what, repo, revision, FileNotFoundError(f"commit {commit}: {'; '.join(errors)}"), remedy)


def _hub_error(what: str, repo: str, revision: str, exc: Exception, remedy: str) -> PretrainedUnavailableError:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    offline = hub_offline()
    at = f" at revision {revision!r}" if revision else ""
    if isinstance(exc, RevisionNotFoundError):
        reason = f"the hub has no revision {revision!r} of {repo!r}"
    elif isinstance(exc, RepositoryNotFoundError):
        reason = "no such repository on the hub (or it is private or gated: log in with `hf auth login`)"
    elif offline:
        which = f"revision {revision!r}" if revision else "it"
        reason = f"offline mode (HF_HUB_OFFLINE) and {which} is not in the local cache {hub_cache_dir()} "
        reason += f"({_cached(repo)})"
    else:
        reason = "hub unreachable or unknown"
    return PretrainedUnavailableError(
        f"cannot load {what} {repo!r}{at} from the Hugging Face hub: {reason}. {remedy} ({type(exc).__name__}: {exc})"
    )


def _cached(repo: str) -> str:
    """The revisions the local cache holds of ``repo`` (``main=0123abcd``, and snapshots no ref names)."""
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(hub_cache_dir()) / repo_folder_name(repo_id=repo, repo_type="model")
    refs = (
        {str(f.relative_to(folder / "refs")): f.read_text().strip() for f in sorted((folder / "refs").rglob("*"))}
        if (folder / "refs").is_dir()
        else {}
    )
    snapshots = sorted(p.name for p in (folder / "snapshots").glob("*")) if (folder / "snapshots").is_dir() else []
    held = [f"{name}={sha}" for name, sha in refs.items()] + [s for s in snapshots if s not in refs.values()]
    return f"cached revisions: {', '.join(held)}" if held else "no revision of it is cached"


_LOADED: dict[tuple[str, str], dict[str, str]] = {}  # (source, revision) -> record, in this process


def remember_upstream(source: str, revision: str, record: dict[str, str]) -> None:
    """Note that weights ``source`` at ``revision`` were loaded from ``record`` (what
    :func:`vlp.models.directory.save` writes as lineage)."""
    _LOADED[(str(source), revision)] = {"source": str(source)} | record


def file_record(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{"sha256": ...}`` of a local file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest()}


def upstream_of(source: str, revision: str = "") -> dict[str, str]:
    """Where the weights named ``source`` (at ``revision``) came from, as recorded when this process loaded them.

    Weights this process did not load (a warning) are recorded as far as can be known now: a local file by its
    SHA-256, a hub name without a commit (``"unknown"``).
    """
    found = _LOADED.get((str(source), revision))
    if found is not None:
        return dict(found)
    log.warning("the upstream of %r was not recorded: it was not loaded by this process", source)
    if looks_like_path(source):
        path = os.path.expanduser(source)
        return {"source": source} | (file_record(path) if os.path.isfile(path) else {})
    return {"source": source, "revision": revision, "commit": "unknown"}


def tokenizer_upstream(tok: PreTrainedTokenizerBase) -> dict[str, str] | None:
    """The hub repo, revision and commit ``tok`` was loaded from (kept through :func:`save_tokenizer`), or None
    for a tokenizer that did not come from the hub (trained, or from a directory that records no hub origin)."""
    record: Any = getattr(tok, _UPSTREAM_ATTR, None)
    return dict(record) if isinstance(record, dict) else None


def _set_upstream(tok: PreTrainedTokenizerBase, record: dict[str, str] | None) -> PreTrainedTokenizerBase:
    if record:
        setattr(tok, _UPSTREAM_ATTR, dict(record))
    return tok


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 1000,
    lowercase: bool = True,
    *,
    min_frequency: int = 1,
    max_len: int = 40,
) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer on ``texts``; the same corpus always gives the same tokenizer.

    The vocabulary is learnt as the ``tokenizers`` WordPiece trainer learns it (merges of the most frequent
    adjacent pair, ``##`` marking a continuation), but here, in :func:`wordpiece_vocab`, ties are broken by
    the merged string, so the result is a function of the corpus. The library's trainer breaks them by hash
    order: six trainings on one 500-caption corpus gave six different vocabularies (four different token
    sets), so a rerun or a resume would have fed new ids into embeddings trained on old ones.

    Args:
        texts: the corpus (e.g. every caption of the training split).
        vocab_size: upper bound on the vocabulary, special tokens included; every character of the corpus is
            kept even beyond it, and a small corpus yields fewer entries.
        lowercase: lowercase and strip accents, as bert-base-uncased does.
        min_frequency: minimum pair frequency for a merge.
        max_len: ``model_max_length`` (truncation length when ``truncation=True``); the paper's code uses 30 in
            pre-training and 40 in fine-tuning.

    Returns:
        A transformers fast tokenizer with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 that adds [CLS]/[SEP].
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words: Counter[str] = Counter()
    for text in texts:
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(str(text))))
    vocab = wordpiece_vocab(words, vocab_size, min_frequency=min_frequency)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix=CONTINUATION))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    # transformers (about 0.5 s) loads where a tokenizer is trained or loaded whole, not with this module: inference
    # encodes through load_text_ids alone
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_len,
        padding_side="right",
    )


def wordpiece_vocab(words: Mapping[str, int], vocab_size: int, *, min_frequency: int = 1) -> dict[str, int]:
    """``{token: id}``: the special tokens, every character (word-initial and ``##`` forms), then merges.

    Each word starts as its characters (``"red"`` -> ``r ##e ##d``); the adjacent pair with the highest
    count over the corpus is merged everywhere (``r ##e`` -> ``re``, ``##e ##d`` -> ``##ed``), the merged
    token joins the vocabulary, and so on until ``vocab_size`` tokens or no pair occurs ``min_frequency``
    times. Ties go to the pair whose merged token sorts first, so the vocabulary depends on ``words`` only.
    Pair counts are kept up to date incrementally with a lazy max-heap: the cost is the corpus's unique
    words times their length, not that times the number of merges.
    """
    names = sorted(words)  # fixed word order: nothing below depends on dict or hash order
    counts = [int(words[w]) for w in names]
    split = [[w[0]] + [CONTINUATION + c for c in w[1:]] for w in names]
    alphabet = sorted({sym for symbols in split for sym in symbols})
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + [a for a in alphabet if a not in SPECIAL_TOKENS])}
    pairs: dict[tuple[str, str], int] = defaultdict(int)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, symbols in enumerate(split):
        for pair in itertools.pairwise(symbols):
            pairs[pair] += counts[i]
            where[pair].add(i)
    heap = [(-n, _merged(p), p) for p, n in pairs.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, merged, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -neg:  # stale entry: the count changed since it was pushed
            continue
        if -neg < min_frequency:
            break
        vocab.setdefault(merged, len(vocab))
        touched: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            old = split[i]
            new = _merge_pair(old, pair, merged)
            if new == old:
                continue
            for p in itertools.pairwise(old):
                pairs[p] -= counts[i]
                touched.add(p)
            for p in itertools.pairwise(new):
                pairs[p] += counts[i]
                where[p].add(i)
                touched.add(p)
            split[i] = new
        pairs.pop(pair, None)
        for p in sorted(touched):
            if pairs.get(p, 0) > 0:
                heapq.heappush(heap, (-pairs[p], _merged(p), p))
    return vocab


def _merged(pair: tuple[str, str]) -> str:
    return pair[0] + pair[1].removeprefix(CONTINUATION)


def _merge_pair(symbols: list[str], pair: tuple[str, str], merged: str) -> list[str]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def tokenizer_digest(tok: PreTrainedTokenizerBase) -> str:
    """sha256 of the vocabulary (token -> id): two tokenizers with one digest give every text the same ids."""
    items = sorted(tok.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def save_tokenizer(tok: PreTrainedTokenizerBase, uri: str) -> str:
    """Save ``tok`` (``save_pretrained`` layout) to the directory ``uri``: a local path or ``s3://`` prefix.

    Files are written to a temporary directory and copied with :func:`vlp.storage.upload`, so each file appears
    atomically. A tokenizer that came from the hub also gets ``upstream.json`` (its :func:`tokenizer_upstream`
    record), which :func:`load_tokenizer` reads back. Returns ``uri``.
    """
    with tempfile.TemporaryDirectory(prefix="vlp-tok-") as tmp:
        tok.save_pretrained(tmp)
        record = tokenizer_upstream(tok)
        if record:
            (Path(tmp) / UPSTREAM_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        for path in sorted(Path(tmp).iterdir()):
            if path.is_file():
                storage.upload(path, storage.join(uri, path.name))
    return uri


_TOKENIZER_REMEDY = (
    "Pass a local directory or s3:// prefix written by save_tokenizer, or train one from the captions with "
    "train_wordpiece."
)


def load_tokenizer(name_or_path: str, revision: str = "") -> PreTrainedTokenizerBase:
    """Load a tokenizer from a directory (local or ``s3://``) written by :func:`save_tokenizer` or
    ``save_pretrained``, or from a hub name such as ``bert-base-uncased``.

    Args:
        name_or_path: the directory, or the hub name.
        revision: for a hub name, the branch, tag or commit to load (``""`` = the default branch, ``main``); it
            is resolved to a commit first and the tokenizer carries ``{"source", "repo", "revision", "commit"}``
            (:func:`tokenizer_upstream`). Must be ``""`` for a directory.

    Raises:
        FileNotFoundError: a path/URI that does not hold a tokenizer.
        ValueError: a revision given with a path.
        PretrainedUnavailableError: a hub name (or revision) that is neither cached nor reachable (e.g. offline),
            or does not exist.
    """
    # transformers loads here, not with this module (see train_wordpiece)
    from transformers import AutoTokenizer

    name = str(name_or_path)
    if looks_like_path(name) and storage.local_path(name) is None:
        check_no_revision(name, revision)
        return _load_from_s3(name)
    if looks_like_path(name):
        check_no_revision(name, revision)
        path = Path(name).expanduser()
        if not (path / "tokenizer.json").is_file() and not (path / "vocab.txt").is_file():
            raise FileNotFoundError(
                f"no tokenizer at {name!r}: expected a directory with tokenizer.json (written by save_tokenizer / "
                "save_pretrained) or vocab.txt"
            )
        return _checked(AutoTokenizer.from_pretrained(str(path)), path)
    commit = resolve_hub_revision(name, revision, what="tokenizer", remedy=_TOKENIZER_REMEDY)
    try:
        tok = AutoTokenizer.from_pretrained(
            name, revision=commit, cache_dir=hub_cache_dir(), local_files_only=hub_offline()
        )
    except (OSError, ValueError) as exc:
        raise _hub_error("tokenizer", name, revision or commit, exc, _TOKENIZER_REMEDY) from exc
    from huggingface_hub import constants

    return _set_upstream(
        tok, {"source": name, "repo": name, "revision": revision or constants.DEFAULT_REVISION, "commit": commit}
    )


def _checked(tok: PreTrainedTokenizerBase, path: Path) -> PreTrainedTokenizerBase:
    """``tok``, after checking that it has every entry of the directory's ``vocab.txt``; with the hub origin the
    directory's ``upstream.json`` records, if any.

    transformers 5 was seen to build a 5-token vocabulary from ``BertTokenizer(vocab_file=...)`` without a
    word; token ids from such a tokenizer would silently miss BERT's embeddings.
    """
    vocab = path / "vocab.txt"
    if vocab.is_file():
        expected = sum(1 for line in vocab.read_text(encoding="utf-8").splitlines() if line.strip())
        if len(tok) < expected:
            raise ValueError(
                f"the tokenizer loaded from {path} has {len(tok)} tokens but its vocab.txt lists {expected}: "
                "the files do not match (re-save it with save_pretrained)"
            )
    upstream = path / UPSTREAM_FILE
    return _set_upstream(tok, json.loads(upstream.read_text()) if upstream.is_file() else None)


def _load_from_s3(uri: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # see load_tokenizer

    files = storage.list_files(uri, recursive=False)
    if not any(f.rsplit("/", 1)[-1] in ("tokenizer.json", "vocab.txt") for f in files):
        raise FileNotFoundError(f"no tokenizer at {uri!r}: expected tokenizer.json written by save_tokenizer")
    with tempfile.TemporaryDirectory(prefix="vlp-tok-") as tmp:
        for f in files:
            storage.download(f, os.path.join(tmp, f.rsplit("/", 1)[-1]))
        return _checked(AutoTokenizer.from_pretrained(tmp), Path(tmp))


# what a saved tokenizer's tokenizer_config.json may say for TextIds to encode as transformers does: the classes that
# wrap tokenizer.json as it is, and keys that change nothing of a text's ids and mask (the special tokens are
# tokenizer.json's; model_max_length is overridden by every call's max_length; is_local and local_files_only are
# where the last load found it, which a tokenizer saved again after a load carries)
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
NEUTRAL_KEYS = frozenset({"backend", "tokenizer_class", "cls_token", "mask_token", "sep_token", "unk_token",
                          "pad_token", "bos_token", "eos_token", "model_max_length", "padding_side", "truncation_side",
                          "clean_up_tokenization_spaces", "added_tokens_decoder", "model_input_names", "is_local",
                          "local_files_only"})  # fmt: skip


class TextIds:
    """What inference asks of a tokenizer, texts to their ids and mask, padded and truncated to a length, through the
    ``tokenizers`` library alone: ``tok(texts, padding="max_length", truncation=True, max_length=L,
    return_tensors="pt")`` gives what transformers' tokenizer gives (``tests/test_text.py`` compares them), without
    importing transformers (about 0.5 s of each search's, server's and evaluation's start-up). Made by
    :func:`load_text_ids` for the tokenizers vlp trains (:func:`train_wordpiece`); thread-safe (one configured
    copy of the tokenizer per length)."""

    def __init__(self, spec: str, pad_token: str, padding_side: str, truncation_side: str) -> None:
        """``spec``: the ``tokenizer.json`` text; the rest as ``tokenizer_config.json`` says.

        Raises:
            ValueError: ``pad_token`` is not in the vocabulary.
        """
        self._spec, self._sides = spec, (padding_side, truncation_side)
        base = Tokenizer.from_str(spec)
        self._size = base.get_vocab_size(with_added_tokens=True)
        pad_id = base.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"the padding token {pad_token!r} is not in the vocabulary")
        self._pad = (pad_token, pad_id)
        self.adds_special_tokens = base.post_processor is not None
        self._by_length: dict[int, Tokenizer] = {}

    def __len__(self) -> int:
        return self._size

    def _at(self, length: int) -> Tokenizer:
        tok = self._by_length.get(length)
        if tok is None:  # two threads may both build one: the same tokenizer, either is kept
            tok = Tokenizer.from_str(self._spec)
            tok.enable_truncation(length, stride=0, strategy="longest_first", direction=self._sides[1])
            tok.enable_padding(direction=self._sides[0], pad_id=self._pad[1], pad_token=self._pad[0], length=length)
            self._by_length[length] = tok
        return tok

    def __call__(
        self,
        texts: list[str],
        padding: str = "max_length",
        truncation: bool = True,
        max_length: int | None = None,
        return_tensors: str = "pt",
    ) -> dict[str, torch.Tensor]:
        """``{"input_ids", "attention_mask"}``, each ``(len(texts), max_length)`` int64."""
        if padding != "max_length" or truncation is not True or max_length is None or return_tensors != "pt":
            raise TypeError("TextIds encodes with padding='max_length', truncation=True, a max_length and "
                            "return_tensors='pt' only")  # fmt: skip
        import torch  # the caller has it; the module stays importable without it

        done = self._at(max_length).encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in done], dtype=torch.long).reshape(len(done), max_length)
        mask = torch.tensor([e.attention_mask for e in done], dtype=torch.long).reshape(len(done), max_length)
        return {"input_ids": ids, "attention_mask": mask}


def load_text_ids(uri: str) -> TextIds | PreTrainedTokenizerBase:
    """The tokenizer saved at ``uri`` (local or ``s3://``) for inference: a :class:`TextIds` where its
    ``tokenizer_config.json`` names a class that wraps ``tokenizer.json`` as it is and nothing that changes the
    ids (:data:`PLAIN_CLASSES`, :data:`NEUTRAL_KEYS`: what :func:`save_tokenizer` writes for a trained tokenizer),
    else transformers' (:func:`load_tokenizer`; a hub tokenizer's class may add its own rules).

    Raises:
        FileNotFoundError: no tokenizer there.
    """
    name = str(uri)
    if storage.local_path(name) is None:
        config_uri, spec_uri = storage.join(name, "tokenizer_config.json"), storage.join(name, "tokenizer.json")
        if not (storage.exists(config_uri) and storage.exists(spec_uri)):
            return load_tokenizer(name)
        config_text, spec = storage.read_text(config_uri), storage.read_text(spec_uri)
    else:
        path = Path(name).expanduser()
        if not ((path / "tokenizer_config.json").is_file() and (path / "tokenizer.json").is_file()):
            return load_tokenizer(name)
        config_text = (path / "tokenizer_config.json").read_text(encoding="utf-8")
        spec = (path / "tokenizer.json").read_text(encoding="utf-8")
    config = json.loads(config_text)
    plain = (
        isinstance(config, dict)
        and config.get("tokenizer_class") in PLAIN_CLASSES
        and set(config) <= NEUTRAL_KEYS
        and isinstance(config.get("pad_token"), str)
    )
    if not plain:
        return load_tokenizer(name)
    try:
        ids = TextIds(spec, config["pad_token"], config.get("padding_side", "right"),
                      config.get("truncation_side", "right"))  # fmt: skip
    except ValueError:  # no such padding token: transformers adds one of its own
        return load_tokenizer(name)
    # without a post-processor transformers writes one of its own (its special tokens around the text)
    return ids if ids.adds_special_tokens else load_tokenizer(name)
