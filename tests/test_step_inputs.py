"""Every step that loads a model checks its inputs first: a missing dataset, an empty split, frames that are
missing or cover none of the split, a model directory without model.json are one line on stderr and exit 2,
within seconds, and before any model, weights or tokenizer is loaded (loading one here raises AssertionError)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import split_rows
from vlp import storage
from vlp.cli import main
from vlp.config import load_config
from vlp.data import manifest
from vlp.data.entities import entities_table

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
# A check reads a few small tables. That it runs before any model is loaded is proven by ``no_model_load``; the bound
# catches a check that waits (retries with back-off on a missing S3 key). 2 s failed once at 2.03 s on a loaded
# machine against Ceph RGW, so it leaves room for load.
FAST_S = 8.0


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a model, loading weights and loading or training a tokenizer raise AssertionError("model loaded")."""
    from vlp.models import directory, family, tokenizer
    from vlp.train import checkpoint

    def refuse(what: str):
        def refused(*args, **kwargs):
            raise AssertionError(f"model loaded: {what}")

        return refused

    for fam in family.families().values():
        monkeypatch.setattr(type(fam), "build", refuse(f"{fam.name} build"))
    monkeypatch.setattr(directory.ModelDir, "load", refuse("weights"))
    monkeypatch.setattr(directory.ModelDir, "tokenizer", refuse("the model's tokenizer"))
    monkeypatch.setattr(tokenizer, "load_tokenizer", refuse("a tokenizer"))
    monkeypatch.setattr(tokenizer, "train_wordpiece", refuse("WordPiece"))
    monkeypatch.setattr(checkpoint, "load_model_weights", refuse("weights"))


def _model_dir(out: Path, kind: str, **extra) -> str:
    """A model directory of ``kind`` in the real layout (model.json, a checkpoint); its weights file is a stub that
    nothing may read."""
    from vlp.models import directory, family
    from vlp.steps.pretrain import model_config

    cfg = load_config(TINY)
    fam = family.of_kind(kind)
    losses = ["vtc"] if kind == fam.kinds.prompter else list(fam.default_losses)
    config = model_config(cfg.model, cfg.model.vocab_size, cfg.model.families["alpro"].num_entities, losses)
    ckpt = out / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"stub: never read")
    directory.save(str(out), kind=kind, config=config, checkpoint=str(ckpt), **extra)
    return str(out)


def _retag(src: str, dst: Path, table: str, split: str) -> None:
    """Copy ``table`` of dataset ``src`` to ``dst`` with every row in ``split``."""
    t = storage.read_parquet(storage.join(src, table))
    i = t.schema.get_field_index("split")
    storage.write_parquet(str(dst / table), t.set_column(i, t.schema.field(i), pa.array([split] * t.num_rows)))


@pytest.fixture(scope="module")
def inputs(tiny_world, tmp_path_factory) -> dict[str, str]:
    """Good inputs (the tiny world, model directories of each kind, a prompt bank, entities) and bad ones."""
    root = tmp_path_factory.mktemp("step_inputs")
    uris = dict(tiny_world)
    uris["alpro"] = _model_dir(root / "alpro", "alpro", entities=["red circle"])
    uris["alpro_qa"] = _model_dir(root / "alpro_qa", "alpro_qa", answers=["red", "blue"])
    uris["prompter"] = _model_dir(root / "prompter", "prompter")
    bank = root / "bank"
    for name in ("prompt_bank.safetensors", "prompt_bank.json"):
        (bank / name).parent.mkdir(exist_ok=True)
        (bank / name).write_bytes(b"stub: never read")
    uris["bank"] = str(bank)
    entities = root / "entities"
    entities.mkdir()
    storage.write_parquet(str(entities / "entities.parquet"), entities_table([("red circle", 3)]))
    uris["entities"] = str(entities)
    # a dataset whose every caption and question is in split "val": no train and no test pairs
    val = root / "all_val"
    val.mkdir()
    shutil.copy(Path(tiny_world["dataset"], manifest.VIDEOS), val)
    for table in (manifest.CAPTIONS, manifest.QA):
        _retag(tiny_world["dataset"], val, table, "val")
    uris["all_val"] = str(val)
    # frames of another dataset: the same store, every video id renamed
    other = root / "other_frames"
    other.mkdir()
    index = storage.read_parquet(storage.join(tiny_world["frames"], "index.parquet"))
    renamed = pc.binary_join_element_wise("other-", index["video_id"], "")
    storage.write_parquet(str(other / "index.parquet"), index.set_column(0, "video_id", renamed))
    uris["other_frames"] = str(other)
    empty = root / "not_a_model"
    empty.mkdir()
    uris["not_a_model"] = str(empty)
    uris["nowhere"] = str(root / "nowhere")
    return uris


# (command, its model argument and which input it names, the table of its pairs, the split it reads)
STEPS = [
    ("pretrain-prompter", None, manifest.CAPTIONS, "train"),
    ("pretrain", ("--prompter", "prompter"), manifest.CAPTIONS, "train"),
    ("pretrain --model albef", None, manifest.CAPTIONS, "train"),
    ("finetune-retrieval", ("--pretrained", "alpro"), manifest.CAPTIONS, "train"),
    ("finetune-retrieval --model ts2net", None, manifest.CAPTIONS, "train"),
    ("finetune-qa", ("--pretrained", "alpro"), manifest.QA, "train"),
    ("evaluate-retrieval", ("--model", "alpro"), manifest.CAPTIONS, "test"),
    ("evaluate-qa", ("--model", "alpro_qa"), manifest.QA, "test"),
]
IDS = [s[0] for s in STEPS]


def _argv(step: tuple, uris: dict, tmp_path: Path, *, dataset: str = "", frames: str = "", model: str = "") -> list:
    command, model_arg, _, _ = step
    argv = [*command.split(), "--dataset", dataset or uris["dataset"], "--frames", frames or uris["frames"]]
    if model_arg:
        argv += [model_arg[0], model or uris[model_arg[1]]]
    if command == "pretrain":
        argv += ["--prompt-bank", uris["bank"]]
    return [*argv, "--out", str(tmp_path / "out"), "--config", str(TINY)]


def _fails_fast(argv: list, capsys) -> str:
    """Run the CLI in this process; it must exit 2 within FAST_S with one line on stderr, and write no output."""
    start = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - start
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert seconds < FAST_S, f"took {seconds:.1f} s"
    assert len(lines) == 1, lines
    assert not Path(argv[argv.index("--out") + 1]).exists()
    return lines[0]


def _split_counts(dataset: str, table: str) -> str:
    rows = storage.read_parquet(storage.join(dataset, table), columns=["split"])["split"].value_counts().to_pylist()
    return ", ".join(f"{r['values']} {r['counts']}" for r in rows)


@pytest.mark.parametrize("step", STEPS, ids=IDS)
def test_a_split_without_pairs_fails_before_the_model_loads(step, inputs, tmp_path, capsys, no_model_load):
    command, _, table, split = step
    line = _fails_fast(_argv(step, inputs, tmp_path, dataset=inputs["all_val"]), capsys)
    texts = "captions" if table == manifest.CAPTIONS else "questions"
    found = _split_counts(inputs["all_val"], table)
    assert found.startswith("val ") and "," not in found  # the precondition: every row is in val
    if split == "train":
        fix = f"this step trains on the train split: ingest {texts} in it"
    else:
        fix = f"set {'retrieval' if table == manifest.CAPTIONS else 'qa'}.split to one of those"
    name = command.split()[0]
    assert line == (
        f"vlp {name}: error: the {split} split of {inputs['all_val']} has no {texts} (its {texts} by split: {found}); "
        f"{fix}"
    )


@pytest.mark.parametrize("step", STEPS, ids=IDS)
def test_frames_that_cover_none_of_the_split_fail_before_the_model_loads(step, inputs, tmp_path, capsys, no_model_load):
    command, _, table, split = step
    line = _fails_fast(_argv(step, inputs, tmp_path, frames=inputs["other_frames"]), capsys)

    videos = len({r["video_id"] for r in split_rows(inputs["dataset"], table, split)})
    assert videos > 0
    pairs = "caption pairs" if table == manifest.CAPTIONS else "question-answer pairs"
    setting = "retrieval.split" if table == manifest.CAPTIONS else "qa.split"
    check = f"check {setting} or " if split == "test" else "are --frames from this dataset? "
    d, f = inputs["dataset"], inputs["other_frames"]
    assert line == (
        f"vlp {command.split()[0]}: error: the {split} split of {d} has no {pairs} with frames (0 of {videos} "
        f"{split} videos are in {f}); {check}re-run `vlp extract-frames --dataset {d} --out {f}`"
    )


@pytest.mark.parametrize("step", STEPS, ids=IDS)
def test_missing_frames_fail_before_the_model_loads(step, inputs, tmp_path, capsys, no_model_load):
    line = _fails_fast(_argv(step, inputs, tmp_path, frames=inputs["nowhere"]), capsys)
    d, f = inputs["dataset"], inputs["nowhere"]
    assert line == (
        f"vlp {step[0].split()[0]}: error: {f}/index.parquet does not exist: run `vlp extract-frames --dataset {d} "
        f"--out {f}` first (--frames is its output)"
    )


@pytest.mark.parametrize("step", STEPS, ids=IDS)
def test_a_missing_dataset_fails_before_the_model_loads(step, inputs, tmp_path, capsys, no_model_load):
    line = _fails_fast(_argv(step, inputs, tmp_path, dataset=inputs["nowhere"]), capsys)
    assert line == (
        f"vlp {step[0].split()[0]}: error: the dataset {inputs['nowhere']} (--dataset) does not exist: pass the "
        "output of `vlp ingest`"
    )


MODEL_STEPS = [s for s in STEPS if s[1]]
MAKERS = {"pretrain": "`vlp pretrain-prompter`", "evaluate-qa": "`vlp finetune-qa`"}  # else a pre-trained or retrieval


@pytest.mark.parametrize("step", MODEL_STEPS, ids=[s[0] for s in MODEL_STEPS])
@pytest.mark.parametrize("where", ["not_a_model", "nowhere"])
def test_a_model_directory_without_model_json_fails_before_anything_loads(
    step, where, inputs, tmp_path, capsys, no_model_load
):
    flag = step[1][0]
    line = _fails_fast(_argv(step, inputs, tmp_path, model=inputs[where]), capsys)
    what = "has no model.json, so it is not a finished model directory" if where == "not_a_model" else "does not exist"
    wanted = MAKERS.get(step[0], "`vlp pretrain` or `vlp finetune-retrieval`")
    assert line == (
        f"vlp {step[0]}: error: {flag} {inputs[where]} {what}: pass the output of {wanted} (or of `vlp "
        "import-checkpoint`)"
    )


def test_a_model_directory_without_its_weights_fails_before_anything_loads(inputs, tmp_path, capsys, no_model_load):
    model = tmp_path / "copy"
    shutil.copytree(inputs["alpro"], model)
    (model / "checkpoints" / "step-000001" / "model.safetensors").unlink()
    step = next(s for s in STEPS if s[0] == "evaluate-retrieval")
    line = _fails_fast(_argv(step, inputs, tmp_path, model=str(model)), capsys)
    assert line == (
        f"vlp evaluate-retrieval: error: --model {model}: model.json names the checkpoint "
        f"{model}/checkpoints/step-000001, which has no model.safetensors: copy the whole model directory"
    )


def test_damaged_weights_in_a_model_directory_are_one_line_naming_the_file(inputs, tmp_path, capsys):
    """The weights file exists (the check passes) but holds no safetensors: the load refuses it, and the CLI says so
    in one line with exit 2, not a traceback."""
    step = next(s for s in STEPS if s[0] == "evaluate-retrieval")
    argv = _argv(step, inputs, tmp_path)  # inputs["alpro"]'s weights are a stub: b"stub: never read"
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlp evaluate-retrieval: error: "), lines
    assert "model.safetensors" in lines[0] and "Traceback" not in lines[0]


def test_build_prompt_bank_checks_its_entities_before_it_loads_the_prompter(inputs, tmp_path, capsys, no_model_load):
    out = tmp_path / "out"
    argv = ["build-prompt-bank", "--prompter", inputs["prompter"], "--out", str(out), "--config", str(TINY)]
    line = _fails_fast([*argv, "--entities", inputs["nowhere"]], capsys)
    n = inputs["nowhere"]
    assert line == (
        f"vlp build-prompt-bank: error: {n}/entities.parquet does not exist: run `vlp mine-entities --out {n}` first "
        "(--entities is its output)"
    )
    line = _fails_fast(["build-prompt-bank", "--prompter", inputs["not_a_model"], *argv[3:], "--entities",
                        inputs["entities"]], capsys)  # fmt: skip
    assert line.startswith(f"vlp build-prompt-bank: error: --prompter {inputs['not_a_model']} has no model.json")


def test_alpro_pretrain_checks_its_prompt_bank_before_it_loads_the_prompter(inputs, tmp_path, capsys, no_model_load):
    argv = _argv(STEPS[1], inputs, tmp_path)
    argv[argv.index("--prompt-bank") + 1] = inputs["nowhere"]
    line = _fails_fast(argv, capsys)
    n = inputs["nowhere"]
    assert line == (
        f"vlp pretrain: error: {n}/prompt_bank.safetensors does not exist: run `vlp build-prompt-bank --out {n}` "
        "first (--prompt-bank is its output)"
    )


@pytest.mark.parametrize("step", STEPS, ids=IDS)
def test_good_inputs_pass_the_check_and_reach_the_model(step, inputs, tmp_path, capsys, no_model_load):
    """The control: with good inputs each step gets past its checks to what the tests above refuse, so those tests
    see a check that comes first, not a step that never loads a model."""
    with pytest.raises(AssertionError, match="model loaded"):
        main(_argv(step, inputs, tmp_path))


def test_good_inputs_pass_the_check_and_reach_the_model_build_prompt_bank(inputs, tmp_path, no_model_load):
    argv = ["build-prompt-bank", "--prompter", inputs["prompter"], "--entities", inputs["entities"]]
    with pytest.raises(AssertionError, match="model loaded"):
        main([*argv, "--out", str(tmp_path / "out"), "--config", str(TINY)])


def test_videos_without_frames_are_counted_and_left_out(inputs, tmp_path, caplog, no_model_load):
    """Frames that cover part of the split pass the check; the videos without frames are counted in the log."""

    test_videos = sorted({r["video_id"] for r in split_rows(inputs["dataset"], manifest.CAPTIONS)})
    frames = tmp_path / "frames"
    frames.mkdir()
    index = storage.read_parquet(storage.join(inputs["frames"], "index.parquet"))
    kept = index.filter(pc.invert(pc.is_in(index["video_id"], pa.array(test_videos[:1]))))
    storage.write_parquet(str(frames / "index.parquet"), kept)
    step = next(s for s in STEPS if s[0] == "evaluate-retrieval")
    with caplog.at_level("WARNING", logger="vlp"), pytest.raises(AssertionError, match="model loaded"):
        main(_argv(step, inputs, tmp_path, frames=str(frames)))
    assert f"1 of {len(test_videos)} test videos of {inputs['dataset']} have no frames in {frames}" in caplog.text
    assert f"says why): {test_videos[0]!r}; their captions are left out" in caplog.text  # named, not only counted


def test_inputs_on_s3_are_checked_the_same_way(inputs, tmp_path, s3_bucket, s3_env, capsys, no_model_load):
    """An s3:// dataset without test pairs, and then one that is not there, fail with the lines local paths give."""
    dataset, frames = f"{s3_bucket}/all_val", f"{s3_bucket}/frames"
    for name in (manifest.VIDEOS, manifest.CAPTIONS, manifest.QA):
        storage.upload(str(Path(inputs["all_val"], name)), f"{dataset}/{name}")
    storage.upload(str(Path(inputs["frames"], "index.parquet")), f"{frames}/index.parquet")
    step = next(s for s in STEPS if s[0] == "evaluate-retrieval")
    line = _fails_fast(_argv(step, inputs, tmp_path, dataset=dataset, frames=frames), capsys)
    found = _split_counts(inputs["all_val"], manifest.CAPTIONS)
    assert line == (
        f"vlp evaluate-retrieval: error: the test split of {dataset} has no captions (its captions by split: {found}); "
        "set retrieval.split to one of those"
    )
    line = _fails_fast(_argv(step, inputs, tmp_path, dataset=f"{s3_bucket}/nowhere", frames=frames), capsys)
    assert line == (
        f"vlp evaluate-retrieval: error: the dataset {s3_bucket}/nowhere (--dataset) does not exist: pass the output "
        "of `vlp ingest`"
    )
