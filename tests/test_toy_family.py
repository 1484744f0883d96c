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
from typing import Any, ClassVar, Literal

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from test_family_contract import CAPTIONS, check_gradients, check_resume, check_round_trip, check_shapes
from vlp import losses
from vlp.models import family
from vlp.models.family import Encoded, FamilySpec, Kinds, LrGroups, PretrainBatch, StepContext, Task
from vlp.models.tokenizer import train_wordpiece
from vlp.ranges import Range, above

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
NAME = "toy"


@dataclass
class ToySettings:
    """``model.toy``: how the clip's frames are pooled and the contrastive temperature it starts from."""

    pool: Literal["mean", "first"] = "mean"
    init_temp: float = 0.07

    RANGES: ClassVar[dict[str, Range]] = {"init_temp": above(0)}


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
