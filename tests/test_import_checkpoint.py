"""``vlp import-checkpoint``: released ALPRO / LAVIS weights give the reference code's numbers in vlp.

The fixture (``tests/fixtures/alpro_parity/``, provenance in its README) holds tiny random-init models in both
release formats, fixed inputs, and what salesforce/ALPRO's and LAVIS's own classes computed from them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common import HOSTILE_CHECKPOINTS, parity_tokenizer
from parity.alpro_parity import retrieval_outputs
from vlp.cli import main
from vlp.models import directory
from vlp.models.importing import CheckpointFormatError, read_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "alpro_parity"
ATOL = 1e-4  # the outputs are O(1)-O(10); a wrong key moves one by >= 4e-3 (README: per-key sensitivity)


@pytest.fixture(scope="module")
def bert_style_tokenizer(tmp_path_factory) -> str:
    """A bert-base-uncased-style directory with the fixture's 120 ids (the parity benchmark's)."""
    path = parity_tokenizer(tmp_path_factory.mktemp("tok"))
    vocab = (Path(path) / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 120 and vocab.index("[CLS]") == 101 and vocab.index("[MASK]") == 103
    return path


@pytest.fixture(scope="module")
def answers_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ans") / "train_ans2label.json"
    path.write_text(json.dumps({"red": 0, "blue": 1, "two": 2}))  # fewer answers than the 5 classifier rows
    return str(path)


def _import(tmp: Path, name: str, tok: str, *extra: str) -> tuple[Path, dict]:
    out = tmp / name.replace(".pt", "")
    args = ["import-checkpoint", "--source", str(FIXTURE / name), "--out", str(out), "--tokenizer", tok,
            "--video-heads", "2", "--text-heads", "2", *extra]  # fmt: skip
    assert main(args) == 0
    return out, json.loads((out / "summary.json").read_text())


def _inputs() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURE / "inputs.pt", weights_only=True)


def _assert_parity(got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    diffs = {k: float((got[k] - reference[k]).abs().max()) for k in got}
    assert max(diffs.values()) < ATOL, diffs
    return diffs


@pytest.mark.parametrize(
    ("name", "fmt", "kind", "outputs"),
    [
        ("alpro_pretrain.pt", "alpro", "alpro", "outputs_alpro.pt"),
        ("lavis_retrieval.pt", "lavis", "alpro_retrieval", "outputs_lavis.pt"),
    ],
)
def test_imported_retrieval_weights_give_the_reference_similarities_vtm_and_mlm_logits(
    name, fmt, kind, outputs, bert_style_tokenizer, tmp_path
):
    out, summary = _import(tmp_path, name, bert_style_tokenizer)
    assert (summary["import"]["format"], summary["model_kind"]) == (fmt, kind)
    model, tok, info = directory.load(str(out))
    assert len(tok) == 120 and info.config.pixel_mean == (0.48145466, 0.4578275, 0.40821073)
    reference = torch.load(FIXTURE / outputs, weights_only=True)
    got = retrieval_outputs(model, _inputs())
    assert ("mlm_logits" in got) == (fmt == "alpro")  # LAVIS's ALPRO has no MLM head
    _assert_parity(got, reference)
    assert info.doc["lineage"]["sha256"] == summary["sha256"] and info.doc["lineage"]["format"] == fmt


@pytest.mark.parametrize(
    ("name", "outputs"), [("alpro_qa.pt", "outputs_alpro.pt"), ("lavis_qa.pt", "outputs_lavis.pt")]
)
def test_imported_qa_weights_give_the_reference_answer_logits(
    name, outputs, bert_style_tokenizer, answers_file, tmp_path
):
    out, summary = _import(tmp_path, name, bert_style_tokenizer, "--answers", answers_file)
    assert summary["model_kind"] == "alpro_qa" and summary["answers"] == 5
    # LAVIS's AlproQA has no VTC projections or temperature: only those keep their initialisation
    unused = ["dual.temp", "dual.text_proj.bias", "dual.text_proj.weight", "dual.video_proj.bias",
              "dual.video_proj.weight"]  # fmt: skip
    assert sorted(summary["import"]["kept_init"]) == (unused if name.startswith("lavis") else [])
    again, _ = _import(tmp_path / "again", name, bert_style_tokenizer, "--answers", answers_file)
    assert (again / "weights" / "model.safetensors").read_bytes() == (
        out / "weights" / "model.safetensors"
    ).read_bytes()
    model, _, info = directory.load(str(out))
    assert info.answers() == ["red", "blue", "two", "[unused answer 3]", "[unused answer 4]"]
    x = _inputs()
    with torch.no_grad():
        got = {
            "qa_logits": model(x["video"], x["input_ids"], x["attention_mask"]),
            "qa_video_embeds": model.dual.video(x["video"]).tokens,
        }
    _assert_parity(got, torch.load(FIXTURE / outputs, weights_only=True))


def test_every_source_key_is_mapped_or_explained(bert_style_tokenizer, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / "alpro_pretrain.pt"))
    out, summary = _import(tmp_path, "alpro_pretrain.pt", bert_style_tokenizer)
    report = json.loads((out / "import_report.json").read_text())
    assert report == summary["import"]
    unmapped = sum(group["keys"] for group in report["unmapped"])
    ties = len(report["ties_checked"])
    assert report["mapped"] + unmapped == len(state)  # tied copies are listed (as unmapped) and checked
    reasons = {group["reason"]: group["keys"] for group in report["unmapped"]}
    prompter = sum(1 for k in state if k.startswith("prompter."))
    assert reasons["the frozen prompter (PEM's teacher in pre-training); import it with kind=prompter"] == prompter
    assert ties == 2 and any("Kinetics-400" in r for r in reasons)
    model = directory.load(str(out))[0]
    assert model.pem_head is not None and model.cfg.num_entities == state["mpm_head.2.weight"].shape[0]
    assert torch.equal(model.pem_head[2].weight, state["mpm_head.2.weight"])


def test_the_pretrained_files_prompter_imports_as_a_prompter(bert_style_tokenizer, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / "alpro_pretrain.pt"))
    out, summary = _import(tmp_path, "alpro_pretrain.pt", bert_style_tokenizer, "--kind", "prompter")
    prompter, _, info = directory.load(str(out), ("prompter",))
    assert info.kind == "prompter" and summary["model_kind"] == "prompter"
    assert torch.equal(prompter.temp, state["prompter.temp"])
    assert torch.equal(prompter.video.blocks[1].temporal_fc.weight,
                       state["prompter.visual_encoder.model.blocks.1.temporal_fc.weight"])  # fmt: skip
    assert not torch.equal(prompter.video.cls_token, state["visual_encoder.model.cls_token"])  # not ALPRO's own


def test_an_imported_model_fine_tunes_and_evaluates(tiny_world, bert_style_tokenizer, tmp_path):
    out, _ = _import(tmp_path, "lavis_retrieval.pt", bert_style_tokenizer)
    tiny = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    common = ["--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--config", tiny]
    assert main(["evaluate-retrieval", *common, "--model", str(out), "--out", str(tmp_path / "zs")]) == 0
    assert main(["finetune-retrieval", *common, "--pretrained", str(out), "--out", str(tmp_path / "ft"),
                 "retrieval.max_steps=1"]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "ft" / "model.json").read_text())
    assert doc["lineage"] == {"pretrained": str(out)} and doc["config"]["pixel_std"] == [
        0.26862954,
        0.26130258,
        0.27577711,
    ]


def test_files_that_do_not_fit_are_refused_with_what_is_wrong(bert_style_tokenizer, answers_file, tmp_path):
    state, _ = read_checkpoint(str(FIXTURE / "alpro_pretrain.pt"))

    def attempt(sd: dict, *extra: str) -> str:
        path = tmp_path / "bad.pt"
        torch.save(sd, path)
        with pytest.raises((CheckpointFormatError, ValueError)) as err:
            from vlp.config import load_config
            from vlp.steps.import_checkpoint import import_checkpoint

            kwargs = dict(zip(extra[::2], extra[1::2], strict=True))
            import_checkpoint(str(path), str(tmp_path / "out"), load_config(None), tokenizer=bert_style_tokenizer,
                              video_heads=2, text_heads=2, **kwargs)  # fmt: skip
        assert not (tmp_path / "out" / "model.json").exists()
        return str(err.value)

    renamed = dict(state)
    renamed["itm_head.wieght"] = renamed.pop("itm_head.weight")
    msg = attempt(renamed)
    assert "unknown source keys ['itm_head.wieght']" in msg and "model keys the file lacks ['vtm_head.weight']" in msg
    untied = dict(state)
    untied["text_encoder.cls.predictions.decoder.weight"] = untied["text_encoder.cls.predictions.decoder.weight"] + 1
    assert "differs from text_encoder.bert.embeddings.word_embeddings.weight" in attempt(untied)
    wrong = dict(state)
    wrong["vision_proj.weight"] = torch.zeros(16, 31)
    assert "shape" in attempt(wrong)
    qa, _ = read_checkpoint(str(FIXTURE / "alpro_qa.pt"))
    assert "--answers" in attempt(qa)
    unknown = {"encoder.weight": torch.zeros(2)}
    assert "has no model family's keys (e.g. ['encoder.weight']): pass --family, one of" in attempt(unknown)
    assert "not an ALPRO checkpoint" in attempt(unknown, "family", "alpro")
    big = tmp_path / "big"
    big.mkdir()
    (big / "vocab.txt").write_text((Path(bert_style_tokenizer) / "vocab.txt").read_text() + "oneword\n")
    (big / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    path = tmp_path / "ok.pt"
    torch.save(state, path)
    from vlp.config import load_config
    from vlp.steps.import_checkpoint import import_checkpoint

    with pytest.raises(ValueError, match="has 121 tokens but the model's text tower has 120 embeddings"):
        import_checkpoint(str(path), str(tmp_path / "out"), load_config(None), tokenizer=str(big), text_heads=2)


HOSTILE = HOSTILE_CHECKPOINTS  # file name -> (how to make it, what the error says): shared with the fault battery


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_damaged_or_hostile_file_is_refused_in_one_line_that_names_it(name, tmp_path, capsys):
    make, says = HOSTILE[name]
    path = make(tmp_path / name)
    out = tmp_path / "out"
    assert main(["import-checkpoint", "--source", str(path), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vlp import-checkpoint: error: {path}: "), captured.err
    assert says in lines[0]
    assert "weights_only=False" not in captured.out + captured.err and "trust" not in captured.err
    assert not out.exists() and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("name", ["tensor_of_4tib.safetensors", "arbitrary_objects.pth"])
def test_the_command_prints_no_traceback_and_no_advice_to_unpickle(name, tmp_path):
    path = HOSTILE[name][0](tmp_path / name)
    cmd = [sys.executable, "-m", "vlp.cli", "import-checkpoint", "--source", str(path), "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " INFO " not in line]
    assert len(errors) == 1 and errors[0].startswith(f"vlp import-checkpoint: error: {path}: "), proc.stderr
    assert "Traceback" not in proc.stderr and "weights_only=False" not in proc.stdout + proc.stderr
