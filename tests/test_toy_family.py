"""A fourth model family needs no edit elsewhere (issue 25): a toy dual encoder, defined here and registered
with :func:`vlp.models.family.register`, meets the family contract, is fine-tuned and evaluated through the CLI,
and compiles into the retrieval DAG, while no file of the package names it."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from test_family_contract import CAPTIONS, check_gradients, check_resume, check_round_trip, check_shapes
from toy_components import PRE, WORDS_FILE, count_caption_words, count_words, toy_pretrain
from vlp import losses
from vlp.models import family
from vlp.models.family import Encoded, FamilySpec, Kinds, LrGroups, PretrainBatch, StepContext, Task
from vlp.models.tokenizer import train_wordpiece
from vlp.ranges import above, ranged

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
NAME = "toy"


@dataclass
class ToySettings:
    """``model.toy``: how the clip's frames are pooled and the contrastive temperature it starts from."""

    pool: Literal["mean", "first"] = "mean"
    init_temp: float = ranged(0.07, above(0))


@dataclass(frozen=True)
class ToyVideo:
    img_size: int = 32
    num_frames: int = 2


@dataclass(frozen=True)
class ToyText:
    vocab_size: int = 100
    max_len: int = 12


@dataclass(frozen=True)
class ToyConfig:
    """What the steps read of every family's config (``video.img_size``, ``text.max_len``, ``text.vocab_size``,
    ``pixel_mean``, ``pixel_std``) and the toy's own settings."""

    video: ToyVideo = field(default_factory=ToyVideo)
    text: ToyText = field(default_factory=ToyText)
    embed_dim: int = 16
    pool: str = "mean"
    init_temp: float = 0.07
    pixel_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    pixel_std: tuple[float, float, float] = (0.5, 0.5, 0.5)


class ToyDualEncoder(nn.Module):
    """A linear map of each frame's pixels, pooled over frames, and a masked mean of word embeddings."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.frame_proj = nn.Linear(3 * cfg.video.img_size**2, cfg.embed_dim)
        self.words = nn.Embedding(cfg.text.vocab_size, cfg.embed_dim)
        self.temp = nn.Parameter(torch.tensor(cfg.init_temp))

    def encode_video(self, video: Tensor) -> tuple[Tensor, Tensor]:  # (B, T, 3, H, W) -> (B, D), (B, T, D)
        frames = self.frame_proj(video.flatten(2))
        pooled = frames.mean(dim=1) if self.cfg.pool == "mean" else frames[:, 0]
        return F.normalize(pooled, dim=-1), frames

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:  # -> (B, D), (B, L, D)
        tokens = self.words(input_ids)
        weights = attention_mask.to(tokens.dtype).unsqueeze(-1)
        pooled = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return F.normalize(pooled, dim=-1), tokens

    def forward(self, batch: PretrainBatch) -> tuple[Tensor, Tensor, Tensor]:
        video, _ = self.encode_video(batch.video)
        text, _ = self.encode_text(batch.input_ids, batch.attention_mask)
        return video, text, losses.clamp_temperature(self.temp)


class ToyFamily:
    """The toy as a :class:`vlp.models.family.Family`: contrastive retrieval only, ranked by cosine similarity (no QA
    model, no pair scorer: it defines neither capability's methods)."""

    name = NAME
    kinds = Kinds(pretrained="toy_pretrained", retrieval="toy_retrieval", qa="")
    default_losses = ("vtc",)
    lr_groups = LrGroups(backbone=("words.",))  # what retrieval.backbone_lr_mult scales

    def weights(self, model: Any) -> tuple[str, str]:
        named = [w for w in (model.video_init, model.text_init) if w and w != family.RANDOM]
        if named:
            raise ValueError(f"the toy family loads no weights, got {named}")
        return "", ""

    def config(self, model: Any, vocab_size: int, num_entities: int = 0) -> ToyConfig:
        if num_entities:
            raise ValueError("the toy family has no entity head")
        self.weights(model)
        own: ToySettings = model.families[self.name]
        return ToyConfig(
            ToyVideo(model.img_size, model.num_frames),
            ToyText(vocab_size, model.max_len),
            embed_dim=model.embed_dim,
            pool=own.pool,
            init_temp=own.init_temp,
            pixel_mean=tuple(model.pixel_mean or ToyConfig.pixel_mean),
            pixel_std=tuple(model.pixel_std or ToyConfig.pixel_std),
        )

    def config_from_dict(self, data: dict[str, Any]) -> ToyConfig:
        pixels = {k: tuple(data[k]) for k in ("pixel_mean", "pixel_std")}
        return ToyConfig(**(data | pixels | {"video": ToyVideo(**data["video"]), "text": ToyText(**data["text"])}))

    def build(self, kind: str, config: ToyConfig, num_answers: int = 0) -> nn.Module:
        if kind not in (self.kinds.pretrained, self.kinds.retrieval):
            raise ValueError(f"the toy family has no {kind!r} model")
        return ToyDualEncoder(config)

    def task_config(self, config: ToyConfig, task: Task, section: Any) -> ToyConfig:
        if task != "retrieval":
            raise ValueError("the toy family has no QA model")
        return config

    def prepare(self, config: ToyConfig, batches_per_epoch: int, global_batch: int) -> ToyConfig:
        return config

    def init_from(self, model: nn.Module, checkpoint: str, task: Task) -> list[str]:
        from vlp.weights import load_pretrained_weights

        return load_pretrained_weights(checkpoint, model)

    def train_step(self, model: nn.Module, batch: Any, ctx: StepContext) -> dict[str, Tensor]:
        video, text, temp = model(batch)
        loss = losses.vtc_loss(video, text, temp, gather=ctx.gather, rank=ctx.rank)
        return {"loss": loss, "loss_vtc": loss.detach(), "temp": temp.detach()}

    def encode_video(self, model: nn.Module, video: Tensor) -> Encoded:
        feat, frames = model.encode_video(video)
        return Encoded(feat, frames)

    def encode_text(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Encoded:
        feat, tokens = model.encode_text(input_ids, attention_mask)
        return Encoded(feat, tokens, attention_mask)

    def similarity(self, model: nn.Module, texts: Encoded, videos: Encoded) -> Tensor:
        return texts.feat @ videos.feat.t()


FAMILY = ToyFamily()
SPEC = FamilySpec(name=NAME, title="Toy", paper="(a test)", settings=ToySettings, load=lambda: FAMILY, pretrains=False,
                  tasks=("retrieval",))  # fmt: skip


@pytest.fixture
def toy() -> Iterator[FamilySpec]:
    family.register(SPEC)
    try:
        yield SPEC
    finally:
        family.unregister(NAME)
    assert NAME not in family.names()


@pytest.fixture(scope="module")
def tok() -> Any:
    return train_wordpiece(CAPTIONS * 4, vocab_size=60)


def test_the_toy_joins_the_registry_and_leaves_it(toy):
    assert family.names()[-1] == NAME and family.get(NAME) is FAMILY and isinstance(FAMILY, family.Family)
    assert not isinstance(FAMILY, family.AnswersQuestions | family.PairScorer)
    assert family.of_kind("toy_retrieval") is FAMILY and not family.spec(NAME).pretrains
    from vlp.config import load_config

    cfg = load_config(TINY, ["model.family=toy", "model.toy.pool=first"])
    assert isinstance(cfg.model.own(), ToySettings) and cfg.model.own().pool == "first"


def test_the_toy_meets_the_family_contract(toy, tok, tmp_path):
    """The contract tests' checks (tests/test_family_contract.py), on the registered toy."""
    values = check_gradients(NAME, "retrieval", tok)
    assert set(values) == {"loss", "loss_vtc", "temp"}
    check_round_trip(NAME, "retrieval", tok, tmp_path / "dir")
    check_shapes(NAME, "retrieval", tok)
    check_resume(NAME, "retrieval", tok, tmp_path / "resume")


def test_finetune_then_evaluate_the_toy_through_the_cli(toy, tiny_world, tmp_path, capsys):
    from vlp.cli import main

    ft, ev = tmp_path / "ft", tmp_path / "ev"
    data = ["--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--config", str(TINY)]
    assert main(["finetune-retrieval", *data, "--model", NAME, "--out", str(ft), "model.toy.init_temp=0.05"]) == 0
    doc = json.loads((ft / "model.json").read_text())
    assert (doc["family"], doc["kind"], doc["lineage"]["video_init"]) == (NAME, "toy_retrieval", "random")
    assert doc["config"]["init_temp"] == 0.05 and doc["config"]["text"]["max_len"] == 24
    logged = [json.loads(line) for line in (ft / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "train/loss_vtc" in r] == [1, 2]  # retrieval.max_steps=2, log_every=1
    assert main(["evaluate-retrieval", *data, "--model", str(ft), "--out", str(ev)]) == 0
    m = json.loads((ev / "metrics.json").read_text())
    for direction in ("t2v", "v2t"):
        assert 0 <= m[f"{direction}_r1"] <= m[f"{direction}_r5"] <= m[f"{direction}_r10"] <= 100
    assert m["t2v_r1"] == m["vtc_t2v_r1"] and m["pairs_scored"] == 0 and "vtm_loss" not in m  # no re-ranking
    assert m["num_texts"] > 0 and math.isfinite(m["t2v_meanr"]) and (ev / "report.html").stat().st_size > 0
    qa = tmp_path / "qa"
    assert main(["finetune-qa", *data, "--pretrained", str(ft), "--out", str(qa)]) == 2  # it has no QA model
    assert f"model family {NAME} has no QA model" in capsys.readouterr().err and not qa.exists()


def test_the_cli_offers_the_toy_where_it_fits(toy, capsys, tmp_path):
    from vlp.cli import build_parser, main

    parser = build_parser()
    args = parser.parse_args(["finetune-retrieval", "--dataset", "d", "--frames", "f", "--out", "o", "--model", NAME])
    assert args.family == NAME
    with pytest.raises(SystemExit):  # it does not pre-train: `vlp pretrain --model toy` is not a choice
        parser.parse_args(["pretrain", "--dataset", "d", "--frames", "f", "--out", "o", "--model", NAME])
    assert "invalid choice: 'toy'" in capsys.readouterr().err
    where = [f"--{arg}={tmp_path / arg}" for arg in ("dataset", "frames", "out")]
    assert main(["pretrain", *where, "--config", str(TINY), "model.family=toy"]) == 2  # through the config
    assert "toy is not pre-trained" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_retrieval_dag_compiles_the_same_with_the_toy_registered_and_takes_it(toy, tmp_path):
    from kfp import compiler

    from pipelines import compile as compile_mod
    from pipelines import config as pipeline_config
    from pipelines import pretrain, submit

    assert NAME not in pretrain.families() and not [n for n in compile_mod.builders() if NAME in n]

    def retrieval_yaml(path: Path) -> str:
        build = compile_mod.builders()["retrieval"]
        compiler.Compiler().compile(build(pipeline_config.load(pipeline_config.CONFIG_DIR / "default.yaml")), str(path))
        return path.read_text(encoding="utf-8")

    with_toy = retrieval_yaml(tmp_path / "with.yaml")
    assert submit.parse_params([f"family={NAME}"], tmp_path / "with.yaml") == {"family": NAME}
    family.unregister(NAME)
    assert with_toy == retrieval_yaml(tmp_path / "without.yaml"), "a family that does not pre-train changes no DAG"


def test_no_shared_file_names_the_toy():
    """The toy lives in this module only: nothing under src/, pipelines/ or components/ mentions it."""
    found = [path.relative_to(ROOT).as_posix() for where in ("src", "pipelines", "components")
             for path in sorted((ROOT / where).rglob("*")) if path.is_file() and path.suffix in (".py", ".yaml", ".md")
             and re.search(rf"\b{NAME}\b", path.read_text(encoding="utf-8"), re.IGNORECASE)]  # fmt: skip
    assert found == []


def test_a_pre_training_family_without_qa_gets_a_dag_without_the_qa_branch(tmp_path):
    """The pre-training DAG fine-tunes and evaluates the tasks the family's spec lists: a toy that pre-trains but
    has no QA model gets the retrieval branch alone, and its DAG is compiled from the spec, without the family."""
    from kfp import compiler

    from pipelines import config as pipeline_config
    from pipelines import pretrain

    spec = replace(SPEC, name=f"{NAME}_pre", pretrains=True)
    family.register(spec)
    try:
        compiler.Compiler().compile(pretrain.build(pipeline_config.load(pipeline_config.CONFIG_DIR / "default.yaml"),
                                                   spec.name), str(tmp_path / "dag.yaml"))  # fmt: skip
    finally:
        family.unregister(spec.name)
    dag = (tmp_path / "dag.yaml").read_text(encoding="utf-8")
    assert "finetune-retrieval" in dag and "evaluate-retrieval" in dag and "pretrain" in dag
    assert "finetune-qa" not in dag and "evaluate-qa" not in dag


# --------------------------------------------------------------------------- a toy whose pre-training reads a prepared
# input of its own (issue 41): the word counts of the training captions, made by a step of its own before `vlp
# pretrain`, declared in its spec; the CLI, the pre-training step and the compiled DAG take it from the declaration.


class WordsHook:
    """The toy's :class:`vlp.models.family.PretrainHook`: it checks and opens the word counts."""

    def checks(self, inputs: Any, terms: Any) -> list[family.InputCheck]:
        from vlp import storage

        if not inputs.get("words"):
            raise ValueError(f"{PRE} pre-training needs word counts (--words): run its count_words step first")
        return [family.InputCheck("--words", storage.join(inputs["words"], WORDS_FILE), remedy="run count_words")]

    def load(self, inputs: Any, terms: Any, device: Any) -> family.PretrainExtras:
        from vlp import storage

        counts = json.loads(storage.read_text(storage.join(inputs["words"], WORDS_FILE)))

        def report(*args: Any) -> dict[str, Any]:
            return {"words_read": len(counts)}

        return family.PretrainExtras(context=counts, lineage={"words": inputs["words"]}, report=report)


class ToyPretrainingFamily(ToyFamily):
    name = PRE
    kinds = Kinds(pretrained="toy_pre_pretrained", retrieval="toy_pre_retrieval", qa="")


@pytest.fixture
def toy_pre(monkeypatch: pytest.MonkeyPatch) -> Iterator[FamilySpec]:
    from pipelines import pretrain

    words = family.Prepared("words", "count_words", reads=("dataset",), flag="--words", help="count_words output")
    spec = FamilySpec(name=PRE, title="Toy-Pre", paper="(a test)", settings=ToySettings,
                      load=lambda: ToyPretrainingFamily(), pretrains=True, tasks=("retrieval",), prepared=(words,),
                      pretraining=WordsHook())  # fmt: skip
    monkeypatch.setitem(pretrain.COMPONENTS, "count_words", count_words)  # the DAG side's step -> component
    monkeypatch.setitem(pretrain.PRETRAIN, PRE, toy_pretrain)
    family.register(spec)
    try:
        yield spec
    finally:
        family.unregister(PRE)


def test_a_family_with_its_own_prepared_input_pretrains_through_the_cli(toy_pre, tiny_world, tmp_path, capsys):
    """`vlp pretrain` offers the toy's --words (its spec's flag) while the toy is registered; the step checks the
    input with the toy's hook before anything is written, reads it, and records it in the model's lineage."""
    from vlp.cli import build_parser, main

    assert "--words" in build_parser()._subparsers._group_actions[0].choices["pretrain"].format_help()  # type: ignore[union-attr]
    data = ["--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--config", str(TINY)]
    out, words = tmp_path / "pre", tmp_path / "words"
    assert main(["pretrain", "--model", PRE, *data, "--out", str(out)]) == 2  # no --words: the hook says what to run
    assert "needs word counts (--words): run its count_words step first" in capsys.readouterr().err
    assert main(["pretrain", "--model", PRE, *data, "--words", str(words), "--out", str(out)]) == 2
    assert f"{words}/{WORDS_FILE} does not exist: run count_words" in capsys.readouterr().err and not out.exists()
    counts = count_caption_words(tiny_world["dataset"], str(words))
    assert main(["pretrain", "--model", PRE, *data, "--words", str(words), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and summary["words_read"] == len(counts) > 0
    doc = json.loads((out / "model.json").read_text())
    assert (doc["family"], doc["kind"], doc["lineage"]) == (PRE, "toy_pre_pretrained", {"words": str(words)})
    family.unregister(PRE)
    with pytest.raises(SystemExit):  # no registered family reads it
        main(["pretrain", *data, "--words", str(words), "--out", str(tmp_path / "x")])
    assert "unrecognized arguments: --words" in capsys.readouterr().err


def test_the_pre_training_dag_is_built_from_the_declared_steps(toy_pre, tmp_path):
    """The toy's DAG runs its count_words step on the ingested dataset and hands its output to the toy's pretrain
    component as ``words``; count_words takes the pipeline config's defaults (no built-in DAG has it)."""
    import yaml
    from kfp import compiler

    from pipelines import config as pipeline_config
    from pipelines import pretrain
    from vlp.schema import from_dict

    path = pipeline_config.CONFIG_DIR / "default.yaml"
    cfg = pipeline_config.load(path)
    defaults = yaml.safe_load(path.read_text(encoding="utf-8"))["defaults"]
    assert cfg.step("count_words") == from_dict(pipeline_config.StepSettings, defaults)
    compiler.Compiler().compile(pretrain.build(cfg, PRE), str(tmp_path / "dag.yaml"))
    dag = next(yaml.safe_load_all((tmp_path / "dag.yaml").read_text(encoding="utf-8")))  # then the platform spec
    tasks = dag["components"]["comp-exit-handler-1"]["dag"]["tasks"]  # the tracked run's steps
    assert {"count-words", "toy-pretrain"} <= set(tasks) and "mine-entities" not in tasks
    words = tasks["toy-pretrain"]["inputs"]["artifacts"]["words"]["taskOutputArtifact"]
    assert words == {"outputArtifactKey": "words", "producerTask": "count-words"}
    dataset = tasks["count-words"]["inputs"]["artifacts"]["dataset"]["taskOutputArtifact"]
    assert dataset == tasks["toy-pretrain"]["inputs"]["artifacts"]["dataset"]["taskOutputArtifact"]
    assert dag["pipelineInfo"]["description"].startswith(f"vlp pre-training ({PRE}): data -> words -> pretrain")


def test_a_declaration_that_cannot_work_is_refused(toy_pre):
    """What a spec declares is checked when it is made and when a DAG is built."""
    from pipelines import config as pipeline_config
    from pipelines import pretrain

    words = toy_pre.prepared[0]
    with pytest.raises(ValueError, match=r"reads \['prompter'\], made neither by the data steps nor before it"):
        replace(toy_pre, prepared=(replace(words, reads=("prompter",)),))
    with pytest.raises(ValueError, match=r"\['words'\] made but read by nothing"):
        replace(toy_pre, prepared=(replace(words, flag=""),))
    with pytest.raises(ValueError, match="two prepared inputs share a step"):
        replace(toy_pre, prepared=(words, replace(words, name="more", flag="--more", reads=("words",))))
    with pytest.raises(ValueError, match="prepared inputs without pretrains"):
        replace(toy_pre, pretrains=False)
    other = replace(toy_pre, name="toy_other", prepared=(replace(words, name="counts"),))
    with pytest.raises(ValueError, match=r"--words names another family's 'words', not 'counts'"):
        family.register(other)
    shared = replace(toy_pre, name="toy_shared")  # no component in PRETRAIN: the shared one, which takes no words
    family.register(shared)
    try:
        with pytest.raises(ValueError, match=r"the pretrain component pretrain takes no input \['words'\]"):
            pretrain.build(pipeline_config.load(pipeline_config.CONFIG_DIR / "default.yaml"), "toy_shared")
    finally:
        family.unregister("toy_shared")
