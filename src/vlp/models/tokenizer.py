"""BERT-style WordPiece tokenizer: trained from a corpus when no hub access, saved and loaded as an artifact.

The paper's text encoder uses ``bert-base-uncased``'s tokenizer. Without network access (tests, the embedded
synthetic world) :func:`train_wordpiece` builds a tokenizer of the same kind from the captions with the
``tokenizers`` library: BERT normaliser (clean text, CJK spacing, lowercase + strip accents), BERT
pre-tokeniser (whitespace and punctuation), WordPiece with ``##`` continuation prefix, and a template
post-processor that adds ``[CLS] ... [SEP]``. Special token ids differ from bert-base-uncased's
(there [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103); here they are the first five ids:
[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. [PAD]=0 in both keeps BERT's ``padding_idx`` convention.

:func:`save_tokenizer` / :func:`load_tokenizer` move the tokenizer through vlp.storage URIs (local paths and
``s3://``); :func:`load_tokenizer` also accepts a hub name when the hub is reachable (or cached), and raises
:class:`PretrainedUnavailableError` with a remedy when it is not.
Without network, huggingface_hub retries for tens of seconds before giving up; set ``HF_HUB_OFFLINE=1`` in
air-gapped environments to fail (or use the local cache) at once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from vlp import storage

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in this order


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
    return storage.is_s3(name) or name.startswith(("/", "./", "../", "~")) or os.path.exists(name)


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 1000,
    lowercase: bool = True,
    *,
    min_frequency: int = 1,
    max_len: int = 40,
) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer on ``texts``.

    Args:
        texts: the corpus (e.g. every caption of the training split).
        vocab_size: upper bound on the vocabulary, special tokens and single characters included; a small corpus
            yields fewer entries.
        lowercase: lowercase and strip accents, as bert-base-uncased does.
        min_frequency: minimum pair frequency for a merge.
        max_len: ``model_max_length`` (truncation length when ``truncation=True``); the paper's code uses 30 in
            pre-training and 40 in fine-tuning.

    Returns:
        A transformers fast tokenizer with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 that adds [CLS]/[SEP].
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
    )
    tok.train_from_iterator((str(t) for t in texts), trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert list(ids.values()) == list(range(len(SPECIAL_TOKENS))), ids  # the trainer puts specials first
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
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


def save_tokenizer(tok: PreTrainedTokenizerBase, uri: str) -> str:
    """Save ``tok`` (``save_pretrained`` layout) to the directory ``uri``: a local path or ``s3://`` prefix.

    Files are written to a temporary directory and copied with :func:`vlp.storage.upload`, so each file appears
    atomically. Returns ``uri``.
    """
    with tempfile.TemporaryDirectory(prefix="vlp-tok-") as tmp:
        tok.save_pretrained(tmp)
        for path in sorted(Path(tmp).iterdir()):
            if path.is_file():
                storage.upload(path, storage.join(uri, path.name))
    return uri


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a directory (local or ``s3://``) written by :func:`save_tokenizer` or
    ``save_pretrained``, or from a hub name such as ``bert-base-uncased``.

    Raises:
        FileNotFoundError: a path/URI that does not hold a tokenizer.
        PretrainedUnavailableError: a hub name that is neither cached nor reachable (e.g. offline).
    """
    name = str(name_or_path)
    if storage.is_s3(name):
        return _load_from_s3(name)
    if looks_like_path(name):
        path = Path(name).expanduser()
        if not (path / "tokenizer.json").is_file() and not (path / "vocab.txt").is_file():
            raise FileNotFoundError(
                f"no tokenizer at {name!r}: expected a directory with tokenizer.json (written by save_tokenizer / "
                "save_pretrained) or vocab.txt"
            )
        return AutoTokenizer.from_pretrained(str(path))
    offline = hub_offline()
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=offline)
    except (OSError, ValueError) as exc:
        mode = "offline mode (HF_HUB_OFFLINE) and not in the local cache" if offline else "hub unreachable or unknown"
        raise PretrainedUnavailableError(
            f"cannot load tokenizer {name!r} from the Hugging Face hub: {mode}. Pass a local directory or s3:// "
            f"prefix written by save_tokenizer, or train one from the captions with train_wordpiece. ({exc})"
        ) from exc


def _load_from_s3(uri: str) -> PreTrainedTokenizerBase:
    files = storage.list_files(uri, recursive=False)
    if not any(f.rsplit("/", 1)[-1] in ("tokenizer.json", "vocab.txt") for f in files):
        raise FileNotFoundError(f"no tokenizer at {uri!r}: expected tokenizer.json written by save_tokenizer")
    with tempfile.TemporaryDirectory(prefix="vlp-tok-") as tmp:
        for f in files:
            storage.download(f, os.path.join(tmp, f.rsplit("/", 1)[-1]))
        return AutoTokenizer.from_pretrained(tmp)
