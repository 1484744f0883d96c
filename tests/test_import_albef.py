"""``vlp import-checkpoint`` for ALBEF: released salesforce/ALBEF and LAVIS weights give the reference numbers.

The fixture (``tests/fixtures/albef_parity/``, provenance in its README) holds tiny random-init ALBEF models in
both formats (an official pre-training file with its MLM head, a LAVIS ``AlbefRetrieval`` file), fixed inputs,
and what the reference classes computed: ITC similarities with the momentum (teacher) similarities over the
queue, the distilled ITC targets at alpha = 0.4, ITM logits of every pair, MLM logits (online and momentum).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from common import parity_tokenizer
from parity.albef_parity import albef_outputs
from vlp.cli import main
from vlp.models import directory
from vlp.models.importing import CheckpointFormatError, read_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "albef_parity"
ATOL = 1e-4
ALPHA = 0.4  # the fixture's distillation weight
CASES = [
    ("albef_pretrain.pt", "albef", "albef", "outputs_albef.pt"),
    ("lavis_retrieval.pt", "lavis", "albef_retrieval", "outputs_lavis.pt"),
]


@pytest.fixture(scope="module")
def bert_style_tokenizer(tmp_path_factory) -> str:
    return parity_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _import(tmp: Path, name: str, tok: str, *extra: str) -> tuple[Path, dict]:
    out = tmp / name.replace(".pt", "")
    args = ["import-checkpoint", "--source", str(FIXTURE / name), "--out", str(out), "--tokenizer", tok,
            "--video-heads", "2", "--text-heads", "2", *extra]  # fmt: skip
    assert main(args) == 0
    return out, json.loads((out / "summary.json").read_text())


def inputs() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURE / "inputs.pt", weights_only=True)


def max_diffs(got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((got[k].double() - reference[k].double()).abs().max()) for k in got}


@pytest.mark.parametrize(("name", "fmt", "kind", "outputs"), CASES)
def test_imported_albef_gives_the_reference_itc_itm_mlm_and_distilled_targets(
    name, fmt, kind, outputs, bert_style_tokenizer, tmp_path
):
    out, summary = _import(tmp_path, name, bert_style_tokenizer)
    assert (summary["import"]["format"], summary["model_kind"]) == (fmt, kind)
    model, tok, info = directory.load(str(out))
    assert info.kind == kind and len(tok) == 120 and info.config.pixel_mean == (0.48145466, 0.4578275, 0.40821073)
    assert (info.config.text.text_layers, info.config.text.fusion_layers, info.config.queue_size) == (2, 2, 8)
    reference = torch.load(FIXTURE / outputs, weights_only=True)
    got = albef_outputs(model, inputs())
    assert ("mlm_logits" in got) == (kind == "albef")  # a retrieval model has no MLM head
    assert set(got) <= set(reference)
    diffs = max_diffs(got, reference)
    assert max(diffs.values()) < ATOL, diffs
    assert info.doc["lineage"]["sha256"] == summary["sha256"] and info.doc["lineage"]["format"] == fmt
    # the momentum model is the file's own, not a copy of the online one
    assert not torch.equal(model.momentum.text_proj.weight, model.online.text_proj.weight)


@pytest.mark.parametrize(("name", "fmt", "kind", "outputs"), CASES)
def test_the_import_report_lists_every_key(name, fmt, kind, outputs, bert_style_tokenizer, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / name))
    out, summary = _import(tmp_path, name, bert_style_tokenizer)
    report = json.loads((out / "import_report.json").read_text())
    assert report == summary["import"]
    unmapped = sum(group["keys"] for group in report["unmapped"])
    assert report["mapped"] + unmapped == len(state)  # every source key: mapped, or unmapped with a reason
    reasons = {group["reason"]: group["keys"] for group in report["unmapped"]}
    assert reasons["BERT's position-index buffer: rebuilt, not learnt"] == 2  # online + momentum
    kept = sorted(k.split(" ")[0] for k in report["kept_init"])
    expected = ["momentum.visual.time_embed", "online.visual.time_embed", "steps"]
    if fmt == "albef":
        assert len(report["ties_checked"]) == 4  # decoder weight + bias, online + momentum
        expected += ["idx_queue"]  # a pre-training file has no clip-id queue
    else:
        assert report["ties_checked"] == []
        expected += ["momentum.text.embeddings.token_type_embeddings.weight",
                     "online.text.embeddings.token_type_embeddings.weight"]  # fmt: skip
    assert kept == sorted(expected)
    model = directory.load(str(out))[0]
    assert torch.equal(model.momentum.visual.cls_token, state["visual_encoder_m.cls_token"])
    assert torch.equal(model.image_queue, state["image_queue"]) and int(model.queue_ptr) == 3
    if fmt == "lavis":
        assert model.idx_queue.tolist() == [-1, -1, 1, -1, -1, -1, 0, -1]  # LAVIS's -100 = vlp's -1
        assert not model.online.text.embeddings.token_type_embeddings.weight.any()


def test_a_pretrained_file_imports_as_retrieval_without_its_mlm_head(bert_style_tokenizer, tmp_path):
    out, summary = _import(tmp_path, "albef_pretrain.pt", bert_style_tokenizer, "--kind", "albef_retrieval")
    reasons = {g["reason"]: g["keys"] for g in summary["import"]["unmapped"]}
    assert reasons["the MLM head: a retrieval model has none (it ranks with ITC + ITM)"] == 10  # 5 per tower
    model = directory.load(str(out))[0]
    got = albef_outputs(model, inputs())
    reference = torch.load(FIXTURE / "outputs_albef.pt", weights_only=True)
    # ITC with the retrieval rule (same image id = positive) and ITM are unchanged: ids 0..2 are distinct
    diffs = max_diffs(got, reference)
    assert max(diffs.values()) < ATOL, diffs


def _attempt(tmp_path: Path, sd: dict, tok: str, **kwargs) -> str:
    from vlp.config import load_config
    from vlp.steps.import_checkpoint import import_checkpoint

    path = tmp_path / "bad.pt"
    torch.save({"model": sd}, path)
    with pytest.raises((CheckpointFormatError, ValueError)) as err:
        import_checkpoint(str(path), str(tmp_path / "out"), load_config(None), tokenizer=tok, video_heads=2,
                          text_heads=2, **kwargs)  # fmt: skip
    assert not (tmp_path / "out" / "model.json").exists()
    return str(err.value)


def test_an_unknown_key_is_an_error(bert_style_tokenizer, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / "albef_pretrain.pt"))
    renamed = dict(state)
    renamed["itm_head.wieght"] = renamed.pop("itm_head.weight")
    msg = _attempt(tmp_path, renamed, bert_style_tokenizer)
    assert "unknown source keys ['itm_head.wieght']" in msg and "model keys the file lacks ['itm_head.weight']" in msg
    extra = dict(state) | {"text_encoder_m.bert.encoder.layer.3.adapter.weight": torch.zeros(2)}
    assert "unknown source keys ['text_encoder_m.bert.encoder.layer.3.adapter.weight']" in _attempt(
        tmp_path, extra, bert_style_tokenizer
    )
    unknown = {"encoder.weight": torch.zeros(2)}
    assert "has no model family's keys" in _attempt(tmp_path, unknown, bert_style_tokenizer)
    assert "ALBEF checkpoint" in _attempt(tmp_path, unknown, bert_style_tokenizer, family="albef")
    assert "not an ALBEF checkpoint" in _attempt(
        tmp_path, {"encoder.weight": torch.zeros(2)}, bert_style_tokenizer, family="albef"
    )


def test_a_shape_mismatch_is_an_error(bert_style_tokenizer, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / "lavis_retrieval.pt"))
    wrong = dict(state)
    wrong["text_proj_m.weight"] = torch.zeros(16, 31)
    msg = _attempt(tmp_path, wrong, bert_style_tokenizer)
    assert "1 shape mismatches ['text_proj_m.weight (16, 31) -> momentum.text_proj.weight (16, 32)']" in msg
    untied = dict(read_checkpoint(str(FIXTURE / "albef_pretrain.pt"))[0])
    untied["text_encoder_m.cls.predictions.decoder.weight"] = (
        untied["text_encoder_m.cls.predictions.decoder.weight"] + 1
    )
    assert "differs from text_encoder_m.bert.embeddings.word_embeddings.weight" in _attempt(
        tmp_path, untied, bert_style_tokenizer
    )
    no_cross = {k: v for k, v in state.items() if ".crossattention." not in k}
    assert "cross-attention" in _attempt(tmp_path, no_cross, bert_style_tokenizer)


def test_an_imported_albef_evaluates_retrieval_on_the_tiny_world(tiny_world, bert_style_tokenizer, tmp_path):
    from vlp.config import load_config
    from vlp.steps.evaluate import evaluate_retrieval

    out, _ = _import(tmp_path, "lavis_retrieval.pt", bert_style_tokenizer)
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    result = evaluate_retrieval(
        tiny_world["dataset"], tiny_world["frames"], str(out), str(tmp_path / "eval"), load_config(tiny)
    )
    assert result["model_kind"] == "albef_retrieval"
    metrics = next(v for v in result.values() if isinstance(v, dict) and "t2v_r1" in v)
    assert metrics["pairs_scored"] > 0 and 0.0 <= metrics["t2v_r1"] <= 100.0  # ITC ranking, then ITM re-ranking
    common = ["--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--config", str(tiny)]
    assert main(["finetune-retrieval", *common, "--pretrained", str(out), "--out", str(tmp_path / "ft"),
                 "retrieval.max_steps=1"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "ft" / "model.json").read_text())["lineage"] == {"pretrained": str(out)}


def test_a_file_without_momentum_weights_starts_the_momentum_model_as_a_copy(bert_style_tokenizer, tmp_path):
    from vlp.config import load_config
    from vlp.steps.import_checkpoint import import_checkpoint

    state, _ = read_checkpoint(str(FIXTURE / "lavis_retrieval.pt"))
    online_only = {k: v for k, v in state.items() if not re.match(r"^[a-z_]+_m\.", k)}
    path = tmp_path / "online.pt"
    torch.save(online_only, path)
    result = import_checkpoint(str(path), str(tmp_path / "out"), load_config(None), tokenizer=bert_style_tokenizer,
                               video_heads=2, text_heads=2)  # fmt: skip
    assert any("copy of online.text_proj.weight" in k for k in result["import"]["kept_init"])
    model = directory.load(str(tmp_path / "out"))[0]
    assert torch.equal(model.momentum.text_proj.weight, model.online.text_proj.weight)
    assert torch.equal(model.momentum.fusion.layers[1].crossattention.self.key.weight,
                       state["text_encoder.encoder.layer.3.crossattention.self.key.weight"])  # fmt: skip
