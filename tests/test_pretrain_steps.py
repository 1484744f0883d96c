"""pretrain-prompter -> build-prompt-bank -> pretrain on the tiny synthetic world, local and s3://."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

from vlp import storage
from vlp.cli import main
from vlp.config import Config, ConfigError, load_config, parse_override
from vlp.models.alpro.pretraining import load_prompter
from vlp.models.alpro.prompts import PromptBank
from vlp.steps.mine_entities import mine_entities
from vlp.steps.pretrain import build_prompt_bank, pretrain, pretrain_prompter

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    cfg = load_config(TINY)
    uris = dict(tiny_world, entities=str(root / "entities"), prompter=str(root / "prompter"), bank=str(root / "bank"))
    mine_entities(uris["dataset"], uris["entities"], cfg)
    uris["prompter_summary"] = pretrain_prompter(uris["dataset"], uris["frames"], uris["prompter"], cfg)
    uris["bank_summary"] = build_prompt_bank(uris["prompter"], uris["entities"], uris["bank"], cfg)
    return uris


def metrics(out: str) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(storage.join(out, "metrics.jsonl")).splitlines()]


def test_prompter_trains_with_vtc_and_reloads(trained):
    assert trained["prompter_summary"]["steps"] == 3
    steps = [m for m in metrics(trained["prompter"]) if "step" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["train/loss"] == pytest.approx(m["train/loss_vtc"]) for m in steps)
    prompter, tok, cfg = load_prompter(trained["prompter"])
    assert not any(p.requires_grad for p in prompter.parameters())
    enc = tok(["a red circle on the grass"], return_tensors="pt")
    feat, _ = prompter.encode_text(enc["input_ids"], enc["attention_mask"])
    assert feat.shape == (1, cfg.embed_dim) and torch.allclose(feat.norm(dim=-1), torch.ones(1))


def test_prompt_bank_matches_the_mined_entities(trained):
    bank = PromptBank.load(trained["bank"])
    mined = storage.read_parquet(storage.join(trained["entities"], "entities.parquet")).sort_by("rank")
    assert bank.entities == mined["entity"].to_pylist()[:20]
    assert bank.video.shape == (len(bank.entities), 32) and not torch.equal(bank.video, bank.image)


def test_pretrain_all_four_objectives_then_resume_is_a_no_op(trained, tmp_path):
    out = str(tmp_path / "alpro")
    cfg = load_config(TINY)
    inputs = {"prompter": trained["prompter"], "bank": trained["bank"]}
    summary = pretrain(trained["dataset"], trained["frames"], out, cfg, inputs)
    assert summary["steps"] == 3
    last = summary["metrics"]
    for term in ("vtc", "pem", "mlm", "vtm"):
        assert torch.isfinite(torch.tensor(last[f"train/loss_{term}"])), last
    doc = json.loads(storage.read_text(storage.join(out, "model.json")))
    assert doc["kind"] == "alpro" and len(doc["entities"]) == 20
    assert storage.exists(storage.join(out, doc["checkpoint"], "model.safetensors"))
    figures = summary["pem_examples"]
    assert figures and all(storage.exists(f) and f.endswith(".png") for f in figures), "ALPRO Fig. 3 examples"
    readme = storage.read_text(storage.join(out, "pem_examples", "README.md"))
    assert all(Path(f).name in readme for f in figures)
    before = _files(out)
    again = pretrain(trained["dataset"], trained["frames"], out, cfg, inputs)
    assert again["skipped"] is True and again["resumed_from_step"] == 3 and again["steps"] == 3
    assert again["metrics"] == last, "a rerun reports the finished run's metrics"
    after = _files(out)
    assert after.keys() == before.keys()
    assert [k for k in before if before[k] != after[k]] == ["summary.json"], "a rerun rewrites only its summary"


def _files(root: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def test_same_config_and_seed_give_the_same_prompter_in_two_processes(tiny_world, tmp_path):
    """Weights are initialised after seeding and the tokenizer is trained deterministically."""
    import os
    import subprocess
    import sys

    outs = [str(tmp_path / name) for name in ("a", "b")]
    for out in outs:
        cmd = [sys.executable, "-m", "vlp.cli", "pretrain-prompter", "--dataset", tiny_world["dataset"],
               "--frames", tiny_world["frames"], "--out", out, "--config", str(TINY),
               "pretrain.max_steps=2"]  # fmt: skip
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (_files(out) for out in outs)
    assert a["tokenizer/tokenizer.json"] == b["tokenizer/tokenizer.json"]
    from safetensors.torch import load

    wa, wb = (load(f["checkpoints/step-000002/model.safetensors"]) for f in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["checkpoints/step-000002/optimizer.safetensors"] == b["checkpoints/step-000002/optimizer.safetensors"]


def test_resume_against_another_tokenizer_is_refused_and_names_the_checkpoint(trained, tmp_path):
    import shutil

    from vlp.models.tokenizer import save_tokenizer, train_wordpiece
    from vlp.train.checkpoint import CheckpointError

    out = tmp_path / "prompter"
    shutil.copytree(trained["prompter"], out)
    shutil.rmtree(out / "tokenizer")
    save_tokenizer(train_wordpiece(["a red circle", "a blue star"], vocab_size=30), str(out / "tokenizer"))
    cfg = load_config(TINY, ["pretrain.max_steps=5"])
    with pytest.raises(CheckpointError, match=r"step-000003/state.json was trained with tokenizer_sha256=\w+ but"):
        pretrain_prompter(trained["dataset"], trained["frames"], str(out), cfg)
    cfg = load_config(TINY, ["pretrain.max_steps=5", "model.tokenizer=" + trained["prompter"] + "/tokenizer"])
    with pytest.raises(ValueError, match=r"model.text_init\) differs from the one .* was trained with"):
        pretrain_prompter(trained["dataset"], trained["frames"], str(out), cfg)


def unchecked(*overrides: str) -> Config:
    """The tiny config with ``overrides`` set after loading, unchecked: as a caller that builds its config in Python
    (or edits a loaded one) hands it to a step."""
    cfg = load_config(TINY)
    for key, value in map(parse_override, overrides):
        section, name = key.split(".")
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
    return cfg


@pytest.mark.parametrize("override", ["pretrain.batch_size=0", "pretrain.max_steps=-1"])
@pytest.mark.parametrize("step", ["pretrain-prompter", "pretrain", "pretrain --model albef"])
def test_a_count_out_of_range_fails_before_the_step_writes_anything(step, override, trained, tmp_path, capsys):
    """pretrain-prompter and ALBEF's pretrain write their tokenizer first thing: nothing may come before the check."""
    inputs = ["--dataset", trained["dataset"], "--frames", trained["frames"]]
    if step == "pretrain":
        inputs += ["--prompter", trained["prompter"], "--prompt-bank", trained["bank"]]
    out = tmp_path / "out"
    assert main([*step.split(), *inputs, "--out", str(out), "--config", str(TINY), override]) == 2
    message = f"invalid config: {override} must be >= 1"
    assert capsys.readouterr().err.strip().splitlines() == [f"vlp {step.split()[0]}: error: {message}"]
    assert not out.exists()
    cfg = unchecked(override, *(["model.family=albef"] if "albef" in step else []))
    with pytest.raises(ConfigError, match=re.escape(message)):
        if step == "pretrain-prompter":
            pretrain_prompter(trained["dataset"], trained["frames"], str(out), cfg)
        else:
            prompter, bank = (trained["prompter"], trained["bank"]) if step == "pretrain" else ("", "")
            pretrain(trained["dataset"], trained["frames"], str(out), cfg, {"prompter": prompter, "bank": bank})
    assert not out.exists()


@pytest.mark.parametrize(
    ("step", "override", "says"),
    [
        ("pretrain-prompter", "model.family=albef", "model family 'albef' has no prompter"),
        ("pretrain-prompter", "model.img_size=30", "img_size=30 must be a positive multiple of patch_size=8"),
        ("pretrain-prompter", "--frames=nowhere", "nowhere/index.parquet does not exist"),
        ("pretrain-prompter", "pretrain.group_by=qa:nosuchtype", "no clip of these pairs has a question of type"),
        ("pretrain --model albef", "model.losses=[vtc]", "losses must be a non-empty subset of ('itc', 'mlm', 'itm')"),
        ("pretrain --model albef", "model.albef.queue_size=6", "queue_size 6 must be a multiple of the global batch 4"),
    ],
)
def test_a_setting_that_cannot_work_fails_before_the_tokenizer_is_written(
    step, override, says, tiny_world, tmp_path, capsys
):
    """The model section, the data and the batch shape are checked before the step trains and saves a tokenizer."""
    out = tmp_path / "out"
    frames = str(tmp_path / "nowhere") if override == "--frames=nowhere" else tiny_world["frames"]
    overrides = [] if override.startswith("--") else [override]
    args = ["--dataset", tiny_world["dataset"], "--frames", frames, "--out", str(out), "--config", str(TINY)]
    assert main([*step.split(), *args, *overrides]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_cli_runs_the_prompter_on_s3(tiny_world, s3_bucket, s3_env):
    out = f"{s3_bucket}/prompter"
    code = main(["pretrain-prompter", "--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"],
                 "--out", out, "--config", str(TINY), "pretrain.max_steps=2"])  # fmt: skip
    assert code == 0
    assert storage.exists(f"{out}/model.json") and storage.exists(f"{out}/tokenizer/tokenizer.json")
    prompter, _, _ = load_prompter(out)
    doc = json.loads(storage.read_text(f"{out}/model.json"))
    from safetensors.torch import load

    saved = load(storage.read_bytes(f"{out}/{doc['checkpoint']}/model.safetensors"))
    loaded = prompter.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)


@pytest.mark.parametrize("preset", ["tiny", "small", "paper"])
def test_model_json_config_round_trip(preset):
    import dataclasses

    from vlp.models.alpro.model import AlproConfig
    from vlp.settings import ModelConfig
    from vlp.steps.pretrain import model_config

    cfg = model_config(ModelConfig(preset=preset, img_size=224), 30522, 1000, ["vtc", "pem", "mlm", "vtm"])
    doc = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert AlproConfig.from_dict(doc, keep_init=True) == cfg
    rebuilt = AlproConfig.from_dict(doc)  # a saved model rebuilds from its checkpoint, never from its starting weights
    assert rebuilt.video.init == rebuilt.text.init == ""
    assert dataclasses.replace(rebuilt, video=cfg.video, text=cfg.text) == cfg


def test_metrics_and_params_reach_mlflow(tiny_world, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(TINY, [f"tracking.tracking_uri={uri}", "tracking.experiment=vlp-test", "pretrain.max_steps=2"])
    pretrain_prompter(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / "p"), cfg)
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vlp-test").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["vlp.step"] == "pretrain_prompter"
    history = client.get_metric_history(run.info.run_id, "train/loss_vtc")
    assert [m.step for m in history] == [1, 2] and all(m.value > 0 for m in history)
    assert run.data.params["optim.lr"] == str(cfg.pretrain.lr) and run.data.params["train.max_steps"] == "2"


def _torchrun(step: list[str], out: str, overrides: list[str]) -> None:
    """``torchrun --nproc-per-node 2 -m vlp.cli <step> ... --out out``: gloo DDP on the CPU."""
    import os
    import subprocess
    import sys

    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "vlp.cli", *step, "--out", out,
           "--config", str(TINY), *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_pretrain_step_under_torchrun_two_processes(trained, tmp_path):
    """Pre-training with VTC and MLM, then fine-tuning with VTC alone, in two processes: DDP refuses a parameter
    without a gradient, so only the enabled objectives' heads may exist (the other Table 1 rows are checked in one
    process: tests/test_family_contract.py); rank 0 alone writes the metrics."""
    losses = ["vtc", "mlm"]
    out = str(tmp_path / "alpro_ddp")
    step = ["pretrain", "--dataset", trained["dataset"], "--frames", trained["frames"], "--prompter",
            trained["prompter"], "--prompt-bank", trained["bank"]]  # fmt: skip
    _torchrun(step, out, ["pretrain.max_steps=2", f"model.losses=[{','.join(losses)}]"])
    steps = [m for m in metrics(out) if "step" in m]
    assert [m["step"] for m in steps] == [1, 2], "rank 0 alone writes the metrics"
    doc = json.loads(storage.read_text(storage.join(out, "model.json")))
    state = json.loads(storage.read_text(storage.join(out, doc["checkpoint"], "state.json")))
    assert state["world_size"] == 2 and doc["config"]["losses"] == losses
    assert sorted(k for k in steps[-1] if k.startswith("train/loss_")) == sorted(f"train/loss_{t}" for t in losses)
    assert all(torch.isfinite(torch.tensor(steps[-1][f"train/loss_{t}"])) for t in losses)
    from safetensors.torch import load  # then fine-tune for retrieval with VTC only: no fusion, no VTM head at all

    ft = str(tmp_path / "retrieval_ddp")
    step = ["finetune-retrieval", "--dataset", trained["dataset"], "--frames", trained["frames"], "--pretrained", out]
    _torchrun(step, ft, ["retrieval.max_steps=2", "retrieval.losses=[contrastive]"])
    doc = json.loads(storage.read_text(storage.join(ft, "model.json")))
    names = load(storage.read_bytes(storage.join(ft, doc["checkpoint"], "model.safetensors"))).keys()
    assert names and not [n for n in names if n.startswith(("fusion.", "vtm_head.", "mlm_head.", "pem_head."))]


def test_group_by_scene_gives_batches_that_share_a_scene(tiny_world):
    from vlp.data import manifest
    from vlp.data.video_text import VideoTextDataset
    from vlp.steps.pretrain import _batches, _dataset, model_config

    cfg = load_config(TINY, ["pretrain.group_by=qa:scene", "pretrain.batch_size=2"])
    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    scene = {r["video_id"]: r["answer"] for r in qa if r["answer_type"] == "scene"}
    pairs = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], split="train", num_frames=2).pairs
    data = _dataset(cfg, tiny_world["dataset"], tiny_world["frames"], model_config(cfg.model, 300, 0, ["vtc"]))
    sampler = _batches(cfg, tiny_world["dataset"], data, tokenizer=None).sampler  # no batch built
    order = [int(i) for i in sampler.epoch_indices(0)]
    shared = [len({scene[pairs[i][0]] for i in order[b : b + 2]}) == 1 for b in range(0, len(order) - 1, 2)]
    counts = {s: sum(scene[v] == s for v, _ in pairs) for s in set(scene.values())}
    assert sum(shared) >= sum(n // 2 for n in counts.values()), (order, counts)  # every full pair of a scene
    assert sum(shared) > len(shared) // 2


@pytest.mark.parametrize(
    ("group_by", "message"), [("scene", "use '' .*qa:<answer_type>"), ("qa:colour", "no clip .* 'colour'")]
)
def test_group_by_rejects_what_it_cannot_group_by(tiny_world, group_by, message):
    from vlp.data.video_text import VideoTextDataset, pair_groups

    pairs = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], split="train", num_frames=2).pairs
    with pytest.raises(ValueError, match=message):
        pair_groups(group_by, tiny_world["dataset"], pairs)
    groups = pair_groups("qa:count", tiny_world["dataset"], pairs)
    assert len(groups) == len(pairs) and groups.min() >= 0 and len(set(groups.tolist())) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("order", ["global", "shards"])
def test_kill_9_then_rerun_ends_where_the_uninterrupted_run_ends(tiny_world, tmp_path, order):
    """SIGKILL a training process (two loader workers building batches ahead) after its second checkpoint; the
    rerun's weights, optimiser and metrics match the uninterrupted run's, and so do those of a run that builds
    its batches on the training thread (no workers): the batches do not depend on the workers."""
    import subprocess
    import sys

    from resume_check import kill_then_rerun

    def cmd(out: Path, workers: int = 2) -> list[str]:
        return [sys.executable, "-m", "vlp.cli", "pretrain-prompter", "--dataset", tiny_world["dataset"],
                "--frames", tiny_world["frames"], "--out", str(out), "--config", str(TINY),
                "pretrain.max_steps=10", "pretrain.ckpt_every=1", f"pretrain.num_workers={workers}",
                f"pretrain.order={order}", "pretrain.shuffle_buffer=8"]  # fmt: skip

    kill_then_rerun(cmd, tmp_path, kill_after=2, last=10)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd(tmp_path / "serial", workers=0), check=True, capture_output=True, timeout=300, env=env)
    final = Path("checkpoints") / "step-000010" / "model.safetensors"
    assert (tmp_path / "serial" / final).read_bytes() == (tmp_path / "straight" / final).read_bytes()


def test_the_paper_preset_starts_from_its_named_weights_and_their_tokenizer():
    from vlp.settings import ModelConfig
    from vlp.steps.common import resolved_inits, tokenizer_source
    from vlp.steps.pretrain import model_config

    paper = ModelConfig(preset="paper", img_size=224)
    assert resolved_inits(paper) == ("vit_base_patch16_224.orig_in21k", "bert-base-uncased")
    assert tokenizer_source(paper) == "bert-base-uncased", "BERT's embeddings need BERT's vocabulary"
    built = model_config(paper, 30522, 0, ["vtc"])
    assert (built.video.init, built.text.init) == ("vit_base_patch16_224.orig_in21k", "bert-base-uncased")
    scratch = ModelConfig(preset="paper", video_init="random", text_init="random")  # random init is explicit
    assert resolved_inits(scratch) == ("", "") and tokenizer_source(scratch) == ""
    assert model_config(scratch, 1000, 0, ["vtc"]).text.init == ""
    assert tokenizer_source(ModelConfig(preset="paper", tokenizer="wordpiece")) == ""
    assert resolved_inits(ModelConfig()) == ("", "") and tokenizer_source(ModelConfig()) == ""  # tiny: random
    assert tokenizer_source(ModelConfig(text_init="/models/bert")) == "/models/bert"
    assert tokenizer_source(ModelConfig(text_init="/models/bert", tokenizer="/tok")) == "/tok"


def test_the_paper_preset_offline_says_how_to_provide_its_weights(tiny_world, tmp_path, monkeypatch):
    from vlp.models.tokenizer import PretrainedUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(TINY, ["model.preset=paper", "model.img_size=224"])
    with pytest.raises(PretrainedUnavailableError, match=r"'bert-base-uncased'.*Pass a local directory"):
        pretrain_prompter(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / "p"), cfg)


def test_local_bert_weights_bring_their_own_tokenizer(tiny_world, tmp_path):
    import dataclasses

    from transformers import BertForMaskedLM

    from vlp.models.text import TextConfig
    from vlp.models.tokenizer import load_tokenizer, tokenizer_digest, train_wordpiece

    bert_dir = tmp_path / "bert"
    tok = train_wordpiece(["a red circle", "a blue square on the grass"], vocab_size=40)
    torch.manual_seed(0)
    bert = BertForMaskedLM(TextConfig.tiny(vocab_size=len(tok), max_len=24).to_bert_config())
    bert.save_pretrained(bert_dir)
    tok.save_pretrained(bert_dir)
    cfg = load_config(TINY, [f"model.text_init={bert_dir}", "pretrain.max_steps=1"])
    out = tmp_path / "prompter"
    pretrain_prompter(tiny_world["dataset"], tiny_world["frames"], str(out), cfg)
    assert tokenizer_digest(load_tokenizer(str(out / "tokenizer"))) == tokenizer_digest(tok)
    doc = json.loads((out / "model.json").read_text())
    assert doc["config"]["text"]["init"] == str(bert_dir) and doc["config"]["text"]["vocab_size"] == len(tok)
    from vlp.models.alpro.model import Alpro, AlproConfig, DualEncoder

    model_cfg = AlproConfig.from_dict(doc["config"], keep_init=True)  # the towers as the step built them
    prompter = DualEncoder(model_cfg.video, model_cfg.text, embed_dim=model_cfg.embed_dim, init_temp=0.07)
    assert torch.equal(prompter.text.word_embeddings.weight, bert.bert.embeddings.word_embeddings.weight)
    alpro = Alpro(dataclasses.replace(model_cfg, losses=("vtc", "mlm")))  # BERT layers 3-4 become the fusion
    assert torch.equal(alpro.fusion.layers[1].output.dense.weight, bert.bert.encoder.layer[3].output.dense.weight)
    assert torch.equal(alpro.mlm_head.bias, bert.cls.predictions.bias)
