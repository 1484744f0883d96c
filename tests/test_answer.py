"""``vlp answer`` (issue 26) on the tiny world, with real QA models (random init) of each family that has one: the
answers by video id are evaluate-qa's predictions and ranking; a video file answers as its stored clip does; a
broken or hostile file is one line and exit 2; a model without QA is refused; the CLI's table, JSON and ``-k``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from conftest import write_mp4
from vlp.cli import main
from vlp.config import Config, load_config
from vlp.data import manifest
from vlp.data.video_text import VideoQADataset, normalize_answer
from vlp.eval.qa import build_answer_vocab
from vlp.index.answer import Answerer, ClipError
from vlp.inference import answer_probabilities, question_tokens
from vlp.models import directory, family
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import ModelConfig, QAConfig, RetrievalConfig
from vlp.steps.evaluate import evaluate_qa
from vlp.steps.finetune import task_data
from vlp.steps.index import index_clips
from vlp.weights import save_model_weights

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
OVERRIDES = ["qa.num_workers=0", "retrieval.num_workers=0"]  # loaders on this thread
ALBEF_TOPK = 5  # ALBEF's decoder ranks this many answers: the rest have probability 0


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def config(*overrides: str) -> Config:
    return load_config(TINY, [*OVERRIDES, *overrides])


def _save(out: Path, name: str, kind: str, tok: Any, answers: list[str] | None = None) -> str:
    """A randomly initialised model of family ``name`` and ``kind`` saved as a model directory (tiny sizes)."""
    fam = family.get(name)
    section = ModelConfig(family=name, preset="tiny", img_size=32, num_frames=2, max_len=24, embed_dim=16)
    cfg = fam.config(section, len(tok), 4 if "bank" in family.spec(name).pretrain_inputs else 0)
    task = QAConfig(num_frames=2, max_len=24, answer_topk=ALBEF_TOPK) if answers else RetrievalConfig(num_frames=2)
    cfg = fam.prepare(fam.task_config(cfg, "qa" if answers else "retrieval", task), 2, 4)
    torch.manual_seed(0)
    model = fam.build(kind, cfg, len(answers or []))
    if answers:
        family.qa_of(fam).set_answers(model, answers, tok)
    weights = save_model_weights(str(out / "weights"), model)
    directory.save(str(out), kind=kind, config=cfg, checkpoint=weights, tokenizer=tok, answers=answers, steps=0)
    return str(out)


@pytest.fixture(scope="module")
def models(tiny_world, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("answer_models")
    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    texts = [r["question"] for r in qa] + [r["answer"] for r in qa]
    tok = train_wordpiece(texts, vocab_size=300)
    answers = build_answer_vocab([normalize_answer(r["answer"]) for r in qa if r["split"] == "train"], 40)
    made = {name: _save(root / name, name, family.get(name).kinds.qa, tok, answers) for name in ("alpro", "albef")}
    made["ts2net"] = _save(root / "ts2net", "ts2net", "ts2net_retrieval", tok)
    made["alpro_retrieval"] = _save(root / "alpro_retrieval", "alpro", "alpro_retrieval", tok)
    return made


@pytest.fixture(scope="module")
def evaluated(tiny_world, models, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """evaluate-qa's predictions.parquet rows per QA family."""
    root = tmp_path_factory.mktemp("answer_eval")
    out = {}
    for name in ("alpro", "albef"):
        evaluate_qa(tiny_world["dataset"], tiny_world["frames"], models[name], str(root / name), config())
        out[name] = pq.read_table(root / name / "predictions.parquet").to_pylist()
    return out


def source_video(tiny_world: dict[str, str], video_id: str) -> Path:
    """The raw world's file of ``video_id`` (what ingest probed and extract-frames decoded)."""
    videos = manifest.read(tiny_world["dataset"], manifest.VIDEOS, manifest.VIDEO_SCHEMA).to_pylist()
    path = Path(next(r["path"] for r in videos if r["video_id"] == video_id))
    return path if path.is_absolute() else Path(tiny_world["dataset"], path)


@pytest.mark.parametrize("name", ["alpro", "albef"])
def test_answers_by_id_are_evaluate_qas_predictions_and_ranking(name, tiny_world, models, evaluated):
    """The top answer and its probability are evaluate-qa's prediction and confidence (its predictions.parquet);
    the whole ranking is the one evaluate-qa's scoring function gives the evaluation's own clip tensors."""
    cfg = config()
    answerer = Answerer(models[name], cfg, frames=tiny_world["frames"])
    info = directory.describe(models[name])
    data = task_data(
        VideoQADataset, cfg.qa, tiny_world["dataset"], tiny_world["frames"], info.config, "test", training=False
    )
    rows = evaluated[name][:4]
    assert [(r["video_id"], r["question"]) for r in rows] == data.pairs[:4]
    video = torch.stack([data[i]["video"] for i in range(len(rows))])
    enc = question_tokens(answerer.tok, [r["question"] for r in rows], answerer.length)
    probs = answer_probabilities(answerer.fam, answerer.net, video, enc["input_ids"], enc["attention_mask"])
    for i, row in enumerate(rows):
        got = answerer.answer(row["video_id"], row["question"], k=5)
        assert torch.equal(answerer.clip(row["video_id"]), video[i])  # the clip evaluate-qa fed the model
        assert got[0].answer == row["prediction"]
        assert got[0].probability == pytest.approx(row["confidence"], abs=1e-5)
        want = probs[i].sort(descending=True, stable=True)
        assert [a.answer for a in got] == [info.answers()[j] for j in want.indices[:5].tolist()]
        assert [a.probability for a in got] == pytest.approx(want.values[:5].tolist(), abs=1e-5)
        assert [a.rank for a in got] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("name", ["alpro", "albef"])
def test_qa_eval_precision_bf16_reaches_evaluate_qa_and_the_answerer(name, tiny_world, models, evaluated, tmp_path):
    """``qa.eval_precision=bf16``: the answerer's top answer and probability are still evaluate-qa's under the same
    config, and every confidence is within 0.02 of fp32's, though not its bits."""
    cfg = config("qa.eval_precision=bf16")
    evaluate_qa(tiny_world["dataset"], tiny_world["frames"], models[name], str(tmp_path / "eval"), cfg)
    rows = pq.read_table(tmp_path / "eval" / "predictions.parquet").to_pylist()
    answerer = Answerer(models[name], cfg, frames=tiny_world["frames"])
    for row in rows[:3]:
        top = answerer.answer(row["video_id"], row["question"], k=1)[0]
        assert (top.answer, top.probability) == (row["prediction"], pytest.approx(row["confidence"], abs=1e-5))
    bf16, fp32 = [r["confidence"] for r in rows], [r["confidence"] for r in evaluated[name]]
    assert len(bf16) == len(fp32) and bf16 != fp32, "bf16 gave fp32's bits (no autocast?)"
    assert max(abs(a - b) for a, b in zip(bf16, fp32, strict=True)) < 0.02


def test_a_video_file_answers_as_its_stored_clip(tiny_world, models):
    """The source mp4 (and a still image) of a clip, decoded and stored in memory as extract-frames stores it, gives
    the clip tensor of the frames store bit for bit, so the same answers."""
    cfg = config()
    by_id = Answerer(models["alpro"], cfg, frames=tiny_world["frames"])
    by_file = Answerer(models["alpro"], cfg)
    videos = manifest.read(tiny_world["dataset"], manifest.VIDEOS, manifest.VIDEO_SCHEMA).to_pylist()
    clip = next(r["video_id"] for r in videos if r["media"] == "video")
    still = next(r["video_id"] for r in videos if r["media"] == "image")
    for video_id in (clip, still):
        path = str(source_video(tiny_world, video_id))
        assert torch.equal(by_file.clip(path), by_id.clip(video_id))
        question = "what colour is the star?"
        assert by_file.answer(path, question, k=40) == by_id.answer(video_id, question, k=40)


def test_broken_and_hostile_files_exit_2_with_one_line_naming_the_file(tiny_world, models, tmp_path, capsys):
    good = write_mp4(tmp_path / "good.mp4", num_frames=24)
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n")
    missing = tmp_path / "missing.mp4"
    args = ["--config", str(TINY), "--model", models["alpro"]]
    for path, why in ((truncated, ""), (text, ""), (missing, "no such file")):
        assert main(["answer", *args, str(path), "what colour is it?", *OVERRIDES]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vlp answer: error: {path}: ") and err.count("\n") == 1 and why in err
    assert main(["answer", *args, str(good), "what colour is it?", "ingest.max_pixels=100", *OVERRIDES]) == 2
    assert capsys.readouterr().err.strip() == (
        f"vlp answer: error: {good}: too large: 64x48 = 3072 pixels a frame > ingest.max_pixels=100"
    )
    with pytest.raises(ClipError, match=r"frames\.max_bytes=10"):  # the frames limits hold too
        Answerer(models["alpro"], config("frames.max_bytes=10")).clip(str(good))
    assert main(["answer", *args, str(good), "what colour is it?", *OVERRIDES]) == 0  # the good one answers
    assert capsys.readouterr().out.splitlines()[0].split() == ["rank", "answer", "probability"]


def test_a_model_without_qa_is_refused_naming_what_to_pass(tiny_world, models, capsys):
    frames = ["--frames", tiny_world["frames"], "--config", str(TINY)]
    assert main(["answer", "--model", models["ts2net"], *frames, "v0", "what?", *OVERRIDES]) == 2
    err = capsys.readouterr().err
    assert "has no QA model" in err and "`vlp answer` takes a `vlp finetune-qa` output" in err
    assert err.count("\n") == 1
    assert main(["answer", "--model", models["alpro_retrieval"], *frames, "v0", "what?", *OVERRIDES]) == 2
    err = capsys.readouterr().err
    assert "holds a 'alpro_retrieval' model; this step needs one of: " in err and "(`vlp finetune-qa`)" in err


def test_cli_table_json_k_and_the_index_path(tiny_world, models, evaluated, tmp_path, capsys):
    row = evaluated["albef"][0]
    base = ["answer", "--model", models["albef"], "--config", str(TINY)]
    store = ["--frames", tiny_world["frames"]]
    assert main([*base, *store, "-k", "3", row["video_id"], row["question"], *OVERRIDES]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["rank", "answer", "probability"] and len(table) == 4
    assert table[1].split()[:2] == ["1", row["prediction"]]
    assert main([*base, *store, "-k", "3", "--json", row["video_id"], row["question"], *OVERRIDES]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"clip", "question", "answers"} and out["clip"] == row["video_id"]
    assert [a["rank"] for a in out["answers"]] == [1, 2, 3]
    assert [a["answer"] for a in out["answers"]] == [line.split()[1] for line in table[1:]]
    assert out["answers"][0]["probability"] == pytest.approx(row["confidence"], abs=1e-5)
    # ALBEF's decoder ranks ALBEF_TOPK answers: -k 1000 lists those alone, their probabilities summing to 1
    assert main([*base, *store, "-k", "1000", "--json", row["video_id"], row["question"], *OVERRIDES]) == 0
    ranked = json.loads(capsys.readouterr().out)["answers"]
    assert len(ranked) == ALBEF_TOPK and sum(a["probability"] for a in ranked) == pytest.approx(1.0, abs=1e-5)
    alpro = Answerer(models["alpro"], config(), frames=tiny_world["frames"])
    every = alpro.answer(row["video_id"], row["question"], k=1000)
    assert len(every) == len(alpro.answers) and sum(a.probability for a in every) == pytest.approx(1.0, abs=1e-5)
    for bad in ("0", "1001", "x"):
        with pytest.raises(SystemExit) as info:
            main([*base, *store, "-k", bad, row["video_id"], row["question"], *OVERRIDES])
        assert info.value.code == 2 and "expected an integer in 1..1000" in capsys.readouterr().err
    assert main([*base, *store, row["video_id"], "  ", *OVERRIDES]) == 2
    assert capsys.readouterr().err.strip() == "vlp answer: error: the question is empty: give the question to answer"
    assert main([*base, *store, "no-such-clip", "what?", *OVERRIDES]) == 2
    assert "has no clip 'no-such-clip': pass one of its video ids" in capsys.readouterr().err
    # an index names its frames store: its ids answer as the store's do
    index = str(tmp_path / "index")
    index_clips(models["ts2net"], tiny_world["frames"], index, config())
    assert main([*base, "--index", index, "--json", row["video_id"], row["question"], *OVERRIDES]) == 0
    assert json.loads(capsys.readouterr().out)["answers"] == ranked[:5]
    with pytest.raises(SystemExit) as info:
        main([*base, *store, "--index", index, row["video_id"], row["question"]])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_damaged_weights_exit_2_with_one_line_in_a_process_that_never_imports_the_training_code(
    tiny_world, models, tmp_path
):
    """`vlp answer` reads a model directory through vlp.weights alone: its damaged-file error is an expected one
    (exit 2, one line naming the file) although no checkpoint code was imported, in a fresh process."""
    import shutil
    import subprocess
    import sys

    model = tmp_path / "model"
    shutil.copytree(models["alpro"], model)
    weights = next(model.rglob("model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    clip = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()[0]["video_id"]
    code = (
        "import sys\nfrom vlp.cli import main\nstatus = main(sys.argv[1:])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vlp.train', 'vlp.steps'))), file=sys.stderr)\n"
        "sys.exit(status)"
    )
    args = ["answer", "--config", str(TINY), "--model", str(model), "--frames", tiny_world["frames"], clip, "why?"]
    done = subprocess.run([sys.executable, "-c", code, *args, *OVERRIDES], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert lines[-1] == "[]", "the training code and the steps were imported"
    assert lines[-2].startswith(f"vlp answer: error: {weights}: not a safetensors file ("), lines
