"""The model directory (vlp.models.directory): one writer, one reader, for every kind of model."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from vlp.data.manifest import PathEscapeError
from vlp.models import directory
from vlp.models.alpro.model import Alpro, AlproConfig, AlproQA, DualEncoder
from vlp.models.tokenizer import train_wordpiece
from vlp.weights import save_model_weights

CAPTIONS = ["a red circle moves left", "a blue square spins", "two green triangles bounce"]


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(CAPTIONS, vocab_size=60)


def _config(tok, **overrides) -> AlproConfig:
    return AlproConfig.tiny(vocab_size=len(tok), losses=("vtc", "mlm", "vtm"), **overrides)


def _save(out: Path, kind: str, module: torch.nn.Module, cfg: AlproConfig, tok, **kwargs) -> None:
    ckpt = save_model_weights(str(out / "weights"), module)
    directory.save(str(out), kind=kind, config=cfg, checkpoint=ckpt, tokenizer=tok, **kwargs)


@pytest.mark.parametrize("kind", ["prompter", "alpro", "alpro_retrieval", "alpro_qa"])
def test_every_kind_saves_and_loads_to_the_same_weights(kind, tok, tmp_path):
    torch.manual_seed(0)
    cfg = _config(tok)
    answers = ["red", "blue", "two"] if kind == "alpro_qa" else None
    module = {
        "prompter": lambda: DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=0.05),
        "alpro": lambda: Alpro(cfg),
        "alpro_retrieval": lambda: Alpro(cfg),
        "alpro_qa": lambda: AlproQA(cfg, 3),
    }[kind]()
    _save(tmp_path, kind, module, cfg, tok, answers=answers, lineage={"pretrained": "/somewhere"}, steps=7)

    loaded, loaded_tok, info = directory.load(str(tmp_path))
    assert type(loaded) is type(module) and not loaded.training
    assert info.kind == kind and info.family.name == "alpro" and info.config == cfg
    assert info.doc["steps"] == 7 and info.doc["lineage"] == {"pretrained": "/somewhere"}
    want, got = module.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert loaded_tok.get_vocab() == tok.get_vocab()
    if kind == "alpro_qa":
        assert info.answers() == answers


def test_a_directory_written_before_format_and_family_existed_still_reads(tok, tmp_path):
    cfg = _config(tok)
    _save(tmp_path, "alpro", Alpro(cfg), cfg, tok)
    doc = json.loads((tmp_path / "model.json").read_text())
    for key in ("format", "family"):
        doc.pop(key)
    (tmp_path / "model.json").write_text(json.dumps(doc))
    assert directory.describe(str(tmp_path)).family.name == "alpro"


def test_the_saved_config_keeps_the_starting_weights_as_lineage_but_rebuilds_without_them(tok, tmp_path):
    cfg = _config(tok)
    _save(tmp_path, "alpro", Alpro(cfg), cfg, tok)
    doc = json.loads((tmp_path / "model.json").read_text())
    doc["config"]["text"]["init"] = "bert-base-uncased"  # what a model started from BERT records
    (tmp_path / "model.json").write_text(json.dumps(doc))
    info = directory.describe(str(tmp_path))
    assert info.config.text.init == "" and info.doc["config"]["text"]["init"] == "bert-base-uncased"
    info.load()  # offline: would fail if it tried to fetch bert-base-uncased


def test_the_wrong_kind_names_the_command_that_makes_the_right_one(tok, tmp_path):
    cfg = _config(tok)
    _save(tmp_path, "alpro", Alpro(cfg), cfg, tok)
    with pytest.raises(ValueError, match=r"'alpro' model; this step needs one of: alpro_qa \(`vlp finetune-qa`\)"):
        directory.describe(str(tmp_path), ("alpro_qa",))


def test_bad_directories_are_clear_errors(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="import-checkpoint"):
        directory.describe(str(tmp_path / "nothing"))
    cfg = _config(tok)
    _save(tmp_path, "alpro", Alpro(cfg), cfg, tok)
    path = tmp_path / "model.json"
    good = json.loads(path.read_text())
    for change, error, match in (
        ({"format": 99}, ValueError, "format 99"),
        ({"kind": "gpt"}, ValueError, "unknown model kind 'gpt'"),
        ({"family": "albef"}, ValueError, "belongs to family 'alpro'"),
        ({"checkpoint": None}, ValueError, "names no checkpoint"),
        ({"checkpoint": "../../etc"}, PathEscapeError, "outside"),
    ):
        path.write_text(json.dumps(good | change))
        with pytest.raises(error, match=match):
            directory.describe(str(tmp_path))


def test_save_refuses_what_could_not_be_read_back(tok, tmp_path):
    cfg = _config(tok)
    ckpt = save_model_weights(str(tmp_path / "weights"), Alpro(cfg))
    with pytest.raises(ValueError, match="not inside the model directory"):
        directory.save(str(tmp_path / "other"), kind="alpro", config=cfg, checkpoint=ckpt)
    with pytest.raises(ValueError, match="needs answer vocabulary"):
        directory.save(str(tmp_path), kind="alpro_qa", config=cfg, checkpoint=ckpt)
    with pytest.raises(RuntimeError, match="without a checkpoint"):
        directory.save(str(tmp_path), kind="alpro", config=cfg, checkpoint=None)
    assert not (tmp_path / "model.json").exists()


def test_a_tokenizer_larger_than_the_embeddings_is_refused(tok, tmp_path):
    cfg = dataclasses.replace(_config(tok), text=dataclasses.replace(_config(tok).text, vocab_size=len(tok) - 1))
    _save(tmp_path, "alpro", Alpro(cfg), cfg, tok)
    with pytest.raises(ValueError, match=f"has {len(tok)} tokens but the model's text tower has {len(tok) - 1}"):
        directory.describe(str(tmp_path)).tokenizer()


def test_steps_import_nothing_private_from_each_other():
    steps = Path(__file__).parents[1] / "src" / "vlp" / "steps"
    private = []
    for path in sorted(steps.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vlp.steps"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, private


def test_lineage_records_the_hub_commits_and_file_digests_a_model_started_from(tok, tmp_path, monkeypatch):
    """Text weights and tokenizer from an (offline) hub repo at tag ``v2``, video weights from a local file: the
    model directory names the commit and the digest, and a model fine-tuned from it carries them on."""
    import hashlib

    from safetensors.torch import save_file
    from transformers import BertForMaskedLM

    from hub_cache import add_snapshot, commit_sha, offline_hub
    from vlp.models.layers.timesformer import TimeSformer
    from vlp.models.tokenizer import load_tokenizer, save_tokenizer

    cache = offline_hub(monkeypatch, tmp_path)
    base = _config(tok)
    torch.manual_seed(0)
    (tmp_path / "bert").mkdir()
    BertForMaskedLM(base.text.to_bert_config()).save_pretrained(tmp_path / "bert")
    save_tokenizer(tok, str(tmp_path / "bert"))
    commit = commit_sha("tiny-bert v2")
    add_snapshot(cache, "vlp-test/tiny-bert", tmp_path / "bert", commit=commit, refs=("main", "v2"))
    vit = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in TimeSformer(base.video).state_dict().items()}, str(vit))

    video = dataclasses.replace(base.video, init=str(vit))
    text = dataclasses.replace(base.text, init="vlp-test/tiny-bert", init_revision="v2")
    cfg = dataclasses.replace(base, video=video, text=text)
    hub_tok = load_tokenizer("vlp-test/tiny-bert", revision="v2")
    _save(tmp_path / "pre", "alpro", Alpro(cfg), cfg, hub_tok, lineage={"dataset": "synthetic"})

    hub = {"repo": "vlp-test/tiny-bert", "revision": "v2", "commit": commit}
    want = {
        "video": {"source": str(vit), "sha256": hashlib.sha256(vit.read_bytes()).hexdigest()},
        "text": {"source": "vlp-test/tiny-bert", **hub, "file": "model.safetensors"},
        "tokenizer": {"source": "vlp-test/tiny-bert", **hub},
    }
    doc = json.loads((tmp_path / "pre" / "model.json").read_text())
    assert doc["lineage"] == {"dataset": "synthetic", "upstream": want}
    assert doc["config"]["text"]["init_revision"] == "v2"

    start = directory.describe(str(tmp_path / "pre"))
    assert start.config.text.init == start.config.text.init_revision == ""  # rebuilding never re-fetches
    _save(tmp_path / "ft", "alpro_retrieval", start.load(), start.config, start.tokenizer(),
          lineage={"pretrained": str(tmp_path / "pre")})  # fmt: skip
    assert json.loads((tmp_path / "ft" / "model.json").read_text())["lineage"] == {
        "pretrained": str(tmp_path / "pre"), "upstream": want
    }  # fmt: skip
